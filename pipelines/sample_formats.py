"""`rescore sample --format trinity-sql | verl-rollouts`: the sample experience as a trainer
writes it — a Trinity-RFT SQLite buffer (TRXP blobs, as `SQLExperienceStorage.write` stores
them) or verl rollout dumps (`{step}.jsonl`, as `trainer.rollout_data_dir` holds them)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import torch


def write(fmt: str, table: pa.Table, output: str, *, table_name: str = "experience") -> str:
    if fmt == "trinity-sql":
        return write_trinity_sqlite(table, output, table_name)
    if fmt == "verl-rollouts":
        return write_verl_rollouts(table, output)
    raise ValueError(f"unknown sample format {fmt!r}")


def write_trinity_sqlite(table: pa.Table, path: str, name: str) -> str:
    if os.path.exists(path):
        raise FileExistsError(f"{path} exists; remove it or pick another --output")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return write_trinity_buffer(table, f"sqlite:///{path}", name)


def write_trinity_buffer(table: pa.Table, url: str, name: str) -> str:
    """The rows as experiences of buffer `name` in database `url` (ids 1..n, TRXP blobs)."""
    from rescore.transforms import sql_database
    from rescore.transforms.rows import trinity_format as trxp

    eng = sql_database.engine(url, must_exist=False)
    meta, blob = sql_database.tables(name)
    meta.metadata.create_all(eng)
    metas, blobs = [], []
    for i, row in enumerate(table.to_pylist(), start=1):
        suffix = f"{i:06x}"
        eid = {"batch": row["batch"], "task": row["task"], "run": row["run"], "step": row["step"], "suffix": suffix}
        item = trxp.new_item(eid=eid, reward=row["reward"], prompt_length=row["prompt_length"],
                             info={"model_version": row["batch"], "source": row["source"]})
        fields = {
            "tokens": torch.tensor(row["tokens"], dtype=torch.int32),
            "logprobs": torch.tensor(row["logprobs"], dtype=torch.float32),
            "action_mask": torch.tensor(row["action_mask"], dtype=torch.bool),
        }
        metas.append({"id": i, "task_id": str(row["task"]), "run_id": row["run"], "msg_id": suffix,
                      "model_version": row["batch"], "reward": row["reward"], "consumed": 0})
        blobs.append({"id": i, "experience_bytes": trxp.encode([(item, fields)])})
    with eng.begin() as conn:
        conn.execute(meta.insert(), metas)
        conn.execute(blob.insert(), blobs)
    eng.dispose()
    return f"wrote {len(metas)} experiences to the Trinity buffer {name!r} in {sql_database.safe_url(url)}"


def write_verl_rollouts(table: pa.Table, directory: str) -> str:
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
