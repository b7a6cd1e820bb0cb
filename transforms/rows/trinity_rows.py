"""Trinity-RFT buffer rows <-> Arrow rows: what one row of a SQL experience buffer (its NAME
columns and its TRXP blob) becomes as a staged Parquet row (`row_columns`, STAGED_SCHEMA), and
what a scored row becomes as a buffer row again (`experience_blob`). Row knowledge only: the
database access is transforms/sql_database.py, the Beam steps transforms/sql_buffer.py.

No Beam; torch (which TRXP blobs hold, rows/trinity_format.py) is imported where a blob is
decoded or built, not with this module.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import pyarrow as pa

from rescore.errors import BlobError, ConfigError, first_line

STAGED_SCHEMA = pa.schema(
    [
        pa.field("batch", pa.int64()),
        pa.field("task", pa.string()),
        pa.field("run", pa.int64()),
        pa.field("step", pa.int64()),
        pa.field("reward", pa.float64()),
        pa.field("tokens", pa.list_(pa.int64())),
        pa.field("prompt_length", pa.int64()),
        pa.field("logprobs", pa.list_(pa.float32())),
        pa.field("action_mask", pa.list_(pa.bool_())),
        pa.field("teacher_logprobs", pa.list_(pa.float32())),
        pa.field("sql_id", pa.int64()),
        pa.field("msg_id", pa.string()),
        pa.field("model_version", pa.int64()),
        pa.field("prompt_text", pa.string()),
        pa.field("response_text", pa.string()),
        pa.field("info", pa.string()),
        pa.field("trinity_blob", pa.binary()),
        pa.field("source_error", pa.string()),
    ]
)
"""The columns a buffer row becomes. `info` is the experience's info dict as JSON,
`trinity_blob` the original blob (the sink writes it back with new advantages, so every field
Rescore does not model, e.g. messages or multi-modal inputs, survives), `source_error` the
reason a row could not be decoded (the validation step rejects such rows with it)."""

INT64 = (-(2**63), 2**63 - 1)


def _as_int(value, what: str, category: str = "bad_eid") -> int:
    if isinstance(value, bool):
        raise ValueError(f"{category}: {what} is {_short(value)}, not an integer")
    if isinstance(value, (int, np.integer)):
        number = int(value)
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        try:
            number = int(value)
        except ValueError:  # digits int() does not read ('²')
            raise ValueError(f"{category}: {what} is {_short(value)}, not an integer") from None
    else:
        raise ValueError(f"{category}: {what} is {_short(value)}, not an integer")
    if not INT64[0] <= number <= INT64[1]:
        raise ValueError(f"{category}: {what} {_short(number)} is beyond the int64 range")
    return number


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _plain(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return str(v)


def _json(value) -> str | None:
    if not value:
        return None
    return json.dumps(value, sort_keys=True, default=_plain)


def _text(value, what: str, category: str) -> str:
    """`value` as text that has a UTF-8 form (ValueError with the reason otherwise)."""
    text = value if isinstance(value, str) else str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{category}: {what} is not valid UTF-8 text") from None
    return text


def _meta_columns(meta_row: dict) -> tuple[dict[str, Any], str | None]:
    """NAME's columns of one row as STAGED_SCHEMA values, and the first reason one of them is
    unusable (SQLite stores whatever it is given: 'n/a' in `reward`, 'two' in `run_id`). An
    unusable value is left null in the row, so the rejected row can still be written."""
    out: dict[str, Any] = {"sql_id": None, "task": None, "run": None, "msg_id": None, "model_version": None, "reward": None}
    reason = None
    checks = (
        ("sql_id", "id", lambda v: _as_int(v, "id", "bad_id")),
        ("task", "task_id", lambda v: _id_text(v, "task_id", "bad_task")),
        ("run", "run_id", lambda v: _as_int(v, "run_id", "bad_run")),
        ("msg_id", "msg_id", lambda v: _id_text(v, "msg_id", "bad_msg_id")),
        ("model_version", "model_version", lambda v: _as_int(v, "model_version", "bad_model_version")),
        ("reward", "reward", _reward),
    )
    for key, column, check in checks:
        value = meta_row.get(column)
        if value is None:
            if column == "id":
                reason = reason or "bad_id: id is null"
            continue
        try:
            out[key] = check(value)
        except ValueError as e:
            reason = reason or str(e)
    return out, reason


def _id_text(value, what: str, category: str) -> str:
    """A text id column's value (SQLite may hand back an integer, or bytes that are not UTF-8)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{category}: {what} is {_short(value)}, not text")
    return _text(value, what, category)


def _reward(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"bad_reward: reward is {_short(value)}, not a number")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"bad_reward: reward {_short(value)} is beyond the range of a float") from None


def row_columns(meta_row: dict, blob) -> dict[str, Any]:
    """One buffer row (its NAME columns and its blob) as STAGED_SCHEMA values.

    A blob that cannot be read safely, whose tensors disagree in length, or a NAME column that
    holds the wrong type gives a row whose `source_error` says why (with the ids NAME holds
    that could be read, so the rejected row can be traced). Whatever the database holds, the
    values returned fit STAGED_SCHEMA: one bad row never fails its range."""
    import torch

    from rescore.transforms.rows import trinity_format as trxp

    row: dict[str, Any] = {f.name: None for f in STAGED_SCHEMA}
    meta, meta_error = _meta_columns(meta_row)
    row.update(meta)
    if isinstance(blob, (bytearray, memoryview)):
        blob = bytes(blob)
    if blob is not None and not isinstance(blob, bytes):  # SQLite: TEXT or a number in the blob column
        row["source_error"] = f"bad_blob: experience_bytes holds {type(blob).__name__}, not bytes"
        return row
    row["trinity_blob"] = blob
    if meta_error:
        row["source_error"] = meta_error
        return row
    if blob is None:
        row["source_error"] = f"missing_blob: no row {meta_row['id']} in the _blob table"
        return row
    try:
        items = trxp.decode(blob)
        if len(items) != 1:
            raise ValueError(f"bad_blob: holds {len(items)} experiences, a buffer row holds one")
        item, t = items[0]
        eid = item.get("eid") or {}
        if not isinstance(eid, dict):
            raise ValueError("bad_blob: eid is not a mapping")
        # EID's default batch is "" (unset): Trinity groups all such rows as one batch; so does 0 here
        batch = eid.get("batch")
        row["batch"] = 0 if isinstance(batch, str) and batch == "" or batch is None else _as_int(batch, "eid.batch")
        row["step"] = _as_int(eid.get("step", 0), "eid.step")
        if row["task"] is None:
            row["task"] = _text(eid.get("task", ""), "eid.task", "bad_eid")
        if row["run"] is None:
            row["run"] = _as_int(eid.get("run", 0), "eid.run")
        if row["msg_id"] is None and eid.get("suffix") is not None:
            row["msg_id"] = _text(eid["suffix"], "eid.suffix", "bad_eid")
        if "tokens" not in t:
            raise ValueError("bad_blob: no tokens tensor (a DPO or SFT buffer?)")
        for name in ("chosen", "rejected"):
            if name in t:
                raise ValueError("bad_blob: a DPO experience (chosen/rejected tokens); Rescore scores RL experience")
        tokens = t["tokens"]
        if tokens.dim() != 1 or tokens.dtype not in _token_dtypes():
            raise ValueError(f"bad_blob: tokens is {tokens.dtype} of shape {list(tokens.shape)}, expected one integer per token")
        if tokens.dtype == torch.uint64 and len(tokens) and int(tokens.max()) > INT64[1]:
            raise ValueError("bad_blob: a token id is beyond the int64 range")
        prompt_length = _as_int(item.get("prompt_length", 1), "prompt_length", "bad_prompt_length")
        response = len(tokens) - prompt_length
        for name in trxp.RESPONSE_FIELDS:
            if name in t and t[name].dim() != 1:
                raise ValueError(f"bad_blob: {name} has shape {list(t[name].shape)}, expected one value per response token")
            if name in t and len(t[name]) != response:
                raise ValueError(
                    f"length_mismatch: {name} has {len(t[name])} values but tokens - prompt_length is "
                    f"{len(tokens)} - {prompt_length} = {response}"
                )
        mask = t.get("action_mask")
        if mask is not None and mask.dtype != torch.bool and bool(((m := mask.to(torch.float64)) != 0).logical_and(m != 1).any()):
            raise ValueError("bad_action_mask: action_mask values must be 0 or 1")
        row["tokens"] = tokens.to(torch.int64).tolist()
        row["prompt_length"] = prompt_length
        if "logprobs" in t:
            row["logprobs"] = t["logprobs"].to(torch.float32).tolist()
        if "teacher_logprobs" in t:
            row["teacher_logprobs"] = t["teacher_logprobs"].to(torch.float32).tolist()
        if mask is not None:
            row["action_mask"] = mask.to(torch.bool).tolist()
        for name in ("prompt_text", "response_text"):
            if isinstance(item.get(name), str):
                row[name] = _text(item[name], name, "bad_blob")
        row["info"] = _json(item.get("info"))
    except (BlobError, ValueError, TypeError, RuntimeError, OverflowError) as e:  # RecursionError too
        keep = {k: row[k] for k in ("sql_id", "task", "run", "msg_id", "model_version", "reward", "trinity_blob")}
        row = {f.name: None for f in STAGED_SCHEMA} | keep
        reason = first_line(e, limit=300)
        row["source_error"] = reason if ":" in reason.split(" ", 1)[0] else f"bad_blob: {reason}"
    return row


def _token_dtypes():
    import torch

    return (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64)


SINK_COLUMNS = (
    "batch", "task", "run", "step", "reward", "tokens", "prompt_length", "logprobs", "action_mask",
    "teacher_logprobs", "advantages", "returns", "score", "copy_index", "msg_id", "model_version", "trinity_blob",
)
"""The scored columns a buffer row is built from (those a file has)."""


def sink_columns(schema: pa.Schema) -> list[str]:
    """The scored columns the sink reads; ConfigError where a buffer cannot be built from them."""
    names = set(schema.names)
    if "trinity_blob" not in names and not {"tokens", "prompt_length"} <= names:
        raise ConfigError(
            "--output-db writes Trinity experiences, which need token ids: the input has no "
            "'tokens' and 'prompt_length' columns (verl rollout dumps hold text only)"
        )
    return [c for c in SINK_COLUMNS if c in names]


def _suffix(row: dict) -> str:
    key = f"{row.get('batch')}/{row.get('task')}/{row.get('run')}/{row.get('step')}"
    return hashlib.sha1(key.encode()).hexdigest()[:6]


def experience_blob(row: dict) -> tuple[bytes, dict[str, Any]]:
    """(TRXP blob, NAME column values) for one scored row.

    With the original blob (`trinity_blob`) every field is kept and only advantages/returns are
    replaced; otherwise the experience is built from the row's columns."""
    import torch

    from rescore.transforms.rows import trinity_format as trxp

    adv = torch.tensor(row["advantages"], dtype=torch.float32)
    ret = torch.tensor(row.get("returns") if row.get("returns") is not None else row["advantages"], dtype=torch.float32)
    copy = row.get("copy_index")
    if row.get("trinity_blob") is not None:
        ((item, fields),) = trxp.decode(row["trinity_blob"])
        suffix = row.get("msg_id") or (item.get("eid") or {}).get("suffix") or _suffix(row)
    else:
        suffix = row.get("msg_id") or _suffix(row)
        tokens = torch.tensor(row["tokens"], dtype=torch.int64)
        if len(tokens) and int(tokens.max()) < 2**31 and int(tokens.min()) >= -(2**31):
            tokens = tokens.to(torch.int32)  # what Trinity's Experience(tokens=list) stores
        eid = {"batch": row["batch"], "task": row["task"], "run": row["run"], "step": row.get("step") or 0, "suffix": suffix}
        item = trxp.new_item(eid=eid, reward=row["reward"], prompt_length=row["prompt_length"])
        fields = {"tokens": tokens}
        if row.get("logprobs") is not None:
            fields["logprobs"] = torch.tensor(row["logprobs"], dtype=torch.float32)
        if row.get("teacher_logprobs") is not None:
            fields["teacher_logprobs"] = torch.tensor(row["teacher_logprobs"], dtype=torch.float32)
        mask = row.get("action_mask")
        response = len(row["tokens"]) - int(row["prompt_length"])
        fields["action_mask"] = (
            torch.tensor([bool(m) for m in mask], dtype=torch.bool) if mask is not None else torch.ones(response, dtype=torch.bool)
        )
    if copy:  # a duplicated row (POLARIS) is an experience of its own: its id must differ
        suffix = f"{suffix}-c{copy}"
    eid = dict(item.get("eid") or {})
    eid["suffix"] = suffix
    item = {**item, "eid": eid}
    fields = {**fields, "advantages": adv, "returns": ret}
    columns = {
        "task_id": str(row["task"]),
        "run_id": int(row["run"]),
        "msg_id": str(suffix)[:64],
        "model_version": row.get("model_version"),
        "reward": None if row.get("reward") is None else float(row["reward"]),
    }
    return trxp.encode([(item, fields)]), columns
