"""`rescore export`: SFT rows or DPO pairs from a finished output, for the next training run.

    rescore export SOURCE --output DIR --format sft [--rule top_k|threshold|raft] [--k 1]
                   [--by reward|score] [--threshold X] [--tokenizer DIR] [--file-format parquet|jsonl]
    rescore export SOURCE --output DIR --format dpo [--by reward|score] [--min-margin M]
                   [--ties first|skip] [--tokenizer DIR] [--file-format parquet|jsonl]

SOURCE is a finished Rescore output (one-shot directory or incremental Delta table; its current
scored rows). DIR receives sft.parquet or dpo.parquet (.jsonl with --file-format jsonl),
export.json (the rule, and the outcome of every scored row: exported, not_chosen, tie,
below_margin, duplicate, copy) and _SUCCESS last; everything is written to a staging directory
first and moved in only once the accounting adds up to the rows read (docs/curating.md gives the
columns and how TRL and verl load them; transforms/rows/export.py the rules).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import pyarrow.parquet as pq

from rescore.errors import ConfigError, InputError, LockBusy, NotFinishedOutputError, last_line
from rescore.transforms.files.layout import EXPORT_JSON, Kind, other_output, other_output_message
from rescore.transforms.rows import export as ex

STAGING = "_staging-export"


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ConfigError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rescore export", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("source", help="a finished Rescore output (directory or incremental table)")
    p.add_argument("--output", required=True, help="directory for the export")
    p.add_argument("--format", required=True, choices=["sft", "dpo"], help="sft rows or dpo pairs")
    p.add_argument("--rule", choices=["top_k", "threshold", "raft"], default="top_k",
                   help="sft: top_k per group (default), every row with value >= --threshold, or raft "
                        "(rows with their group's top reward, reward > --threshold, default 0)")
    p.add_argument("--k", type=int, default=1, help="sft top_k: rows per group (default 1)")
    p.add_argument("--by", choices=["reward", "score"], default="reward", help="rank rows by reward (default) or score")
    p.add_argument("--threshold", type=float, help="sft threshold / raft: the value a row needs")
    p.add_argument("--min-margin", "--min_margin", type=float, default=0.0,
                   help="dpo: skip a group whose best - worst value is below this (default 0)")
    p.add_argument("--ties", choices=["first", "skip"], default="first",
                   help="dpo: among rows sharing the best or worst value, take the lowest run (first, default), "
                        "or skip the group (skip)")
    p.add_argument("--tokenizer", help="a tokenizer directory (transformers): also write the text")
    p.add_argument("--file-format", "--file_format", choices=["parquet", "jsonl"], default="parquet")
    p.add_argument("--overwrite", action="store_true", help="replace a finished export in --output")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--wait-for-lock", "--wait_for_lock", type=float, default=0.0, metavar="SECONDS",
                   help="when another run or export is writing --output, wait up to SECONDS for it (default 0: refuse at once)")
    return p


def _decoder(path: str | None):
    if path is None:
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError("--tokenizer needs the transformers package (pip install 'rescore[models]')") from None
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"--tokenizer {path}: not a loadable tokenizer ({type(e).__name__})") from None
    return lambda ids: tok.decode(ids, skip_special_tokens=False)


def run(argv: list[str]) -> dict:
    args = _parser().parse_args(argv)
    if args.k < 1:
        raise ConfigError(f"--k must be >= 1, got {args.k}")
    if args.format == "sft" and args.rule == "threshold" and args.threshold is None:
        raise ConfigError("--rule threshold needs --threshold")
    if args.format == "dpo" and (args.rule != "top_k" or args.threshold is not None or args.k != 1):
        raise ConfigError("--rule, --k and --threshold are for --format sft")
    if args.format == "sft" and (args.min_margin != 0.0 or args.ties != "first"):
        raise ConfigError("--min-margin and --ties are for --format dpo")
    if not 0 <= args.min_margin < math.inf:
        raise ConfigError(f"--min-margin must be a finite number >= 0, got {args.min_margin}")
    if args.threshold is not None and not math.isfinite(args.threshold):  # export.json is strict JSON
        raise ConfigError(f"--threshold must be a finite number, got {args.threshold}")
    if not 0 <= args.wait_for_lock < math.inf:
        raise ConfigError(f"--wait-for-lock must be a number of seconds >= 0, got {args.wait_for_lock}")
    out = args.output
    from rescore.pipelines import command_output

    command_output.refuse_bucket(out, "--output", "export")
    found = other_output(os.listdir(out), Kind.EXPORT) if "://" not in out and os.path.isdir(out) else None
    if found:  # never mixed into (nor, with --overwrite, over) another command's output: name it
        raise ConfigError(other_output_message(out, found))
    command_output.claim(out, "--output", command_output.EXPORT_NAMES, sources=[args.source],
                         overwrite=args.overwrite, what="an export", legacy=(EXPORT_JSON, ("format", "rows_read", "rows")))
    from rescore.transforms.files import lock

    with lock.acquire(out, args.wait_for_lock):  # one run or export at a time per output (a second one: exit 2, naming the holder)
        command_output.claim(out, "--output", command_output.EXPORT_NAMES, sources=[args.source],
                             overwrite=args.overwrite, what="an export", legacy=(EXPORT_JSON, ("format", "rows_read", "rows")))
        return _export(args, out)


def _export(args, out: str) -> dict:
    from rescore.pipelines import command_output
    from rescore.pipelines.load import load_scored

    table = load_scored(args.source)
    missing = [c for c in (*ex.NEEDED, args.by) if c not in table.column_names]
    if missing and table.num_rows:
        raise InputError(f"{args.source}: the scored rows have no {', '.join(dict.fromkeys(missing))} column (export needs token ids)")
    if table.num_rows:
        _check_values(args.source, table, args.format, args.by)
    decode = _decoder(args.tokenizer)
    if args.format == "sft":
        rule = ex.SftRule(args.rule, args.by, args.k, args.threshold)
        rows, outcome = ex.select_sft(table, rule) if table.num_rows else ([], ex.np.zeros(0, dtype=ex.np.int8))
        data = ex.sft_table(table, rows, args.by, decode)
    else:
        rule = ex.DpoRule(args.by, args.min_margin, args.ties)
        pairs, outcome = ex.select_dpo(table, rule) if table.num_rows else ([], ex.np.zeros(0, dtype=ex.np.int8))
        data = ex.dpo_table(table, pairs, args.by, decode)
    counts = ex.counts(outcome)
    if sum(counts.values()) != table.num_rows:  # cannot happen: every row has one outcome
        raise RuntimeError(f"export accounting: {sum(counts.values())} outcomes for {table.num_rows} rows")
    name = f"{args.format}.{args.file_format}"
    staging = command_output.stage(out, STAGING)
    if args.file_format == "parquet":  # no rows: a valid empty Parquet file with the schema
        pq.write_table(data, os.path.join(staging, name))
    else:
        with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
            for row in data.to_pylist():
                f.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
    doc = {
        "source": args.source, "format": args.format, "file": name, "records": data.num_rows,
        "rule": {k: v for k, v in vars(rule).items()}, "tokenizer": args.tokenizer,
        "rows_read": table.num_rows, "rows": counts, "output": out,
    }
    with open(os.path.join(staging, EXPORT_JSON), "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True, allow_nan=False)
    command_output.publish(staging, out, [name, EXPORT_JSON])
    return doc


MAX_VALUE = 8.98e307
"""A reward or score beyond ±this could make a DPO margin (best - worst) overflow float64."""


def _check_values(source: str, table, fmt: str, by: str) -> None:
    """The values export ranks by and publishes (reward, score): a finished Rescore output holds
    only finite ones; a file that breaks that is refused before anything is written (exit 2),
    never ranked by a NaN or published as one. For dpo, none so large that a margin overflows."""
    import pyarrow.compute as pc

    for column in dict.fromkeys(("reward", by, "score")):
        if column not in table.column_names:
            continue
        values = pc.cast(table[column], "float64")
        finite = pc.is_finite(values)  # null where the value is null
        bad = int(pc.sum(pc.invert(finite)).as_py() or 0)
        if column in ("reward", by):  # a row is ranked by it: a null cannot be
            bad += values.null_count
        if bad:
            raise InputError(f"{source}: {bad} scored rows have a {column} that is not a finite number "
                             "(null, NaN or infinite), which a finished Rescore output never holds")
        top = pc.max(pc.abs(values)).as_py()
        if fmt == "dpo" and column in ("reward", by) and top is not None and top > MAX_VALUE:
            raise InputError(f"{source}: a {column} beyond ±{MAX_VALUE:g}: a DPO margin between two rows would overflow")


def main(argv: list[str]) -> int:
    try:
        doc = run(argv)
    except (ConfigError, InputError, NotFinishedOutputError, LockBusy) as e:
        print(f"rescore: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001  (one line; nothing was published)
        print(f"rescore: error: export failed: {last_line(e)}", file=sys.stderr)
        return 1
    if "--quiet" not in argv:
        rows = ", ".join(f"{v:,} {k}" for k, v in doc["rows"].items() if v)
        what = "rows" if doc["format"] == "sft" else "pairs"
        print(f"rescore: exported {doc['records']:,} {doc['format']} {what} -> {os.path.join(doc['output'], doc['file'])} "
              f"({doc['rows_read']:,} scored rows: {rows or 'none'})", file=sys.stderr)
    return 0
