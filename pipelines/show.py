"""`rescore show PATH`: what a Rescore output holds.

    rescore show OUTPUT [--batches]

For an incremental table: its version, strategy, rows, batches (rows per batch with
--batches), the input files it has scored, its runs, and the input that is pending (files
matching the recorded --input patterns that are new, changed or gone since they were scored).
For a one-shot directory: strategy, rows, batches and input files from its metrics.json.
Exit 0, or 2 with one line when PATH is not a finished Rescore output.
"""

from __future__ import annotations

import argparse
import json
import sys

import pyarrow as pa
import pyarrow.compute as pc

from rescore.errors import first_line
from rescore.transforms.files import storage
from rescore.transforms.files.layout import METRICS


def _batch_rows(table: pa.Table) -> list[tuple[int, int]]:
    if table.num_rows == 0:
        return []
    counts = pc.value_counts(table["batch"])
    pairs = [(v["values"].as_py(), v["counts"].as_py()) for v in counts]
    return sorted(pairs, key=lambda p: (p[0] is None, p[0]))


def _batch_summary(pairs: list[tuple[int, int]]) -> str:
    if not pairs:
        return "0"
    ids = [b for b, _ in pairs if b is not None]
    span = f"  ({ids[0]}..{ids[-1]})" if ids else ""
    return f"{len(pairs):,}{span}"


def describe(path: str, *, batches: bool = False) -> list[str]:
    from rescore.errors import InputError
    from rescore.pipelines.load import kind_of, load_scored
    from rescore.transforms.files.delta_table import load_state, open_table

    kind = kind_of(path)
    ids = load_scored(path, columns=["batch"])
    pairs = _batch_rows(ids)
    lines = []
    if kind == "table":
        state = load_state(path)
        dt = open_table(path, error=InputError)
        lines += [
            f"{path}: incremental Delta Lake table, version {dt.version()}",
            f"  strategy        {state.strategy}  (config {(state.config_hash or '')[:12]})",
            f"  rows            {ids.num_rows:,}",
            f"  batches         {_batch_summary(pairs)}",
            f"  input files     {len(state.files):,} scored",
            f"  runs            {len(state.runs):,}",
        ]
        for r in state.runs[-5:]:
            lines.append(
                f"    {r['run']}  {r.get('time', '')}  {r.get('new_files', 0)} new, {r.get('changed_files', 0)} changed, "
                f"{r.get('deleted_files', 0)} deleted files; {r.get('batches_rescored', 0):,} batches rescored"
            )
        if len(state.runs) > 5:
            lines.append(f"    ... {len(state.runs) - 5} earlier runs")
        lines.append("  pending input   " + _pending(state))
    else:
        metrics = storage.join(path, METRICS)
        try:
            doc = json.loads(storage.read_text(metrics)) if storage.exists(metrics) else {}
        except ValueError as e:
            doc = e
        if not isinstance(doc, dict):
            from rescore.errors import NotFinishedOutputError

            raise NotFinishedOutputError(f"{metrics} is not a JSON object ({doc}); not a finished Rescore output")
        lines += [
            f"{path}: one-shot run (scored-*.parquet, _SUCCESS)",
            f"  strategy        {doc.get('strategy')}  (config {(doc.get('config_hash') or '')[:12]})",
            f"  rows            {ids.num_rows:,}",
            f"  batches         {_batch_summary(pairs)}",
            f"  input files     {doc.get('input_files', '?')}",
            "  runs            1 (one-shot)",
            "  pending input   n/a (one-shot runs do not track their input; see --incremental)",
        ]
    if batches:
        lines.append("  batch            rows")
        lines += [f"  {b!s:<12} {n:>8,}" for b, n in pairs]
    return lines


def _pending(state) -> str:
    from rescore.transforms.files.selection import list_inputs

    if not state.inputs:
        return "unknown (no --input recorded)"
    try:
        files = list_inputs(state.inputs)
    except Exception as e:  # noqa: BLE001  (an input that is gone is what we report)
        return f"cannot list {', '.join(state.inputs)}: {e}"
    new = [f for f in files if f.key not in state.files]
    changed = [f for f in files if f.key in state.files and not f.same_content(state.files[f.key])]
    gone = set(state.files) - {f.key for f in files}
    head = f"{len(new)} new, {len(changed)} changed, {len(gone)} deleted files (input {', '.join(state.inputs)})"
    names = [f"\n    new      {f.path}" for f in new[:10]] + [f"\n    changed  {f.path}" for f in changed[:10]]
    names += [f"\n    deleted  {k}" for k in sorted(gone)[:10]]
    return head + "".join(names)


def main(argv: list[str]) -> int:
    from rescore.errors import InputError, NotFinishedOutputError

    class _Parser(argparse.ArgumentParser):
        def error(self, message):  # one line, like every other Rescore failure
            raise NotFinishedOutputError(message)

    parser = _Parser(prog="rescore show", description="What a Rescore output holds.")
    parser.add_argument("path", help="a one-shot output directory or an incremental table")
    parser.add_argument("--batches", action="store_true", help="list rows per batch")
    try:
        args = parser.parse_args(argv)
    except NotFinishedOutputError as e:
        print(f"rescore: error: {e}", file=sys.stderr)
        return 2
    try:
        lines = describe(args.path, batches=args.batches)
    except (NotFinishedOutputError, InputError) as e:
        print(f"rescore: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001  (whatever a damaged output makes a library raise: one line, exit 1)
        print(f"rescore: error: {args.path}: cannot be described ({first_line(e)})",
              file=sys.stderr)
        return 1
    try:
        print("\n".join(lines))
        sys.stdout.flush()
    except BrokenPipeError:  # `rescore show OUT | head`: the reader has all it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
