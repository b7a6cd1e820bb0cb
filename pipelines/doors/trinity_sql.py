"""The Trinity-RFT SQL buffer door: a buffer (two tables, NAME and NAME_blob) in a database.

    rescore --input sqlite:///buffer.db --input-table experience --output DIR --algorithm grpo
    rescore sample --format trinity-sql --output buffer.db [--table experience] [--overwrite]

The launcher reads count/min/max of NAME's ids and cuts them into ranges of about --shard-rows
rows (transforms/sql_database.py: plan_source); a Beam job reads, decodes and writes each range
as one Parquet read unit (transforms/sql_buffer.py: StageBuffer). The sample is a SQLite buffer
of TRXP blobs, as Trinity's `SQLExperienceStorage.write` stores them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rescore.errors import ConfigError
from rescore.transforms.settings import option

DB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "mariadb", "oracle", "mssql")


def is_db_url(text: str) -> bool:
    scheme = text.split("://", 1)[0] if "://" in text else ""
    return scheme.split("+", 1)[0].lower() in DB_SCHEMES


@dataclass(frozen=True, kw_only=True)
class TrinitySqlOptions:
    """The run options only this door reads (a run's `cfg.input_table`)."""

    input_table: str | None = option(
        None, metavar="NAME", help="read the Trinity-RFT experience buffer NAME from the database URL given as --input",
    )


class TrinitySqlDoor:
    name = "trinity-sql"
    input_format = None  # picked by --input-table (or a database URL as --input)
    what = "SQL buffers"
    chosen_by = "--input-table"
    help = "a Trinity-RFT SQL experience buffer"
    sample_what = "a Trinity-RFT SQLite experience buffer"
    sample_output = "the SQLite file"
    options = TrinitySqlOptions
    staged = True
    no_tokens = None

    def selects(self, cfg) -> bool:
        return bool(cfg.input_table) or any(map(is_db_url, cfg.inputs))

    def option_problem(self, values: Mapping[str, Any]) -> str | None:
        if values.get("input_table") and values.get("input_format") != "parquet":
            return "--input-table reads a Trinity-RFT SQL buffer; it takes no --input-format"
        return None

    def check(self, cfg) -> None:
        if not cfg.input_table:
            raise ConfigError(f"--input {cfg.inputs[0]} is a database URL: name the Trinity buffer to read with --input-table NAME")
        if len(cfg.inputs) != 1:
            raise ConfigError("--input-table reads one buffer: pass one --input database URL")

    def read(self, cfg, directory: str, run) -> tuple[list[str], dict[str, Any]]:
        from rescore.transforms import sql_buffer, sql_database
        from rescore.transforms.files import storage

        plan = sql_database.plan_source(cfg.inputs[0], cfg.input_table, cfg.shard_rows)
        run(lambda p: p | "StageBuffer" >> sql_buffer.StageBuffer(plan, directory))
        info = {"format": self.name, "url": sql_database.safe_url(plan.url), "table": plan.table, "rows": plan.rows,
                "id_ranges": len(plan.ranges)}
        return storage.list_dir(directory, "*.parquet"), info

    def shown_inputs(self, cfg, source: Mapping[str, Any]) -> list[str]:
        return [source["url"]]  # the URL the user gave, its password hidden

    def write_sample(self, table, output: str, args) -> str:
        if getattr(args, "overwrite", False) and os.path.isfile(output):
            os.remove(output)
        return write_trinity_sqlite(table, output, getattr(args, "table", "experience"))


def write_trinity_sqlite(table, path: str, name: str) -> str:
    if os.path.exists(path):
        raise FileExistsError(f"{path} exists; remove it or pick another --output")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return write_trinity_buffer(table, f"sqlite:///{path}", name)


def write_trinity_buffer(table, url: str, name: str) -> str:
    """The rows as experiences of buffer `name` in database `url` (ids 1..n, TRXP blobs)."""
    import torch

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


DOOR = TrinitySqlDoor()
