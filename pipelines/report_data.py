"""`rescore report`'s data: a finished run's metrics.json (or, for an --incremental table, the
document its committed runs add up to) and the columns of its Parquet the charts need (`RunData`,
reading only those columns), and the group tables computed from them (groups per batch, solved
by all / none, group sizes, pass rates). numpy and Arrow only: the charts are report_charts.py,
the page report_page.py, the command report.py. Column names come from the output contract
(schemas/experience.py, rows/copies.py); the response length from rows/response.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rescore.errors import ReportError
from rescore.schemas.experience import AUDIT_NAMES, FILTER_REASON, INPUT_COLUMNS, SCORE_COLUMNS
from rescore.transforms.files import storage
from rescore.transforms.files.layout import DELTA_LOG, FILTERED_FILES, INCREMENTAL_WORK, METRICS, SCORED_FILES
from rescore.transforms.rows.copies import COPY_INDEX, SOURCE_TASK
from rescore.transforms.rows.response import response_length_columns, response_lengths

KNOWN_COLUMNS = {*(c.name for c in INPUT_COLUMNS), *SCORE_COLUMNS, COPY_INDEX, SOURCE_TASK, *AUDIT_NAMES}
"""The contract's columns; any other numeric scalar column is an `extra` the report charts."""


@dataclass
class RunData:
    """The columns of a finished run's output that the charts need."""

    batch: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """(n,) batch of every original scored row."""
    task: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    reward: np.ndarray = field(default_factory=lambda: np.zeros(0))
    score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """(n,) NaN where no score was written."""
    length: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """(n,) response tokens, NaN where the data has no list column to count."""
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    """other numeric scalar columns (model stage outputs, extra rewards)."""
    audit: dict[str, np.ndarray] = field(default_factory=dict)
    filtered_batch: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    filtered_task: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    filtered_reward: np.ndarray = field(default_factory=lambda: np.zeros(0))
    filter_reasons: dict[str, int] = field(default_factory=dict)
    has_filtered_files: bool = False

    @property
    def scores(self) -> np.ndarray:
        return self.score[~np.isnan(self.score)]


def _numeric_scalar(t) -> bool:
    import pyarrow as pa

    return (pa.types.is_floating(t) or pa.types.is_integer(t)) and not pa.types.is_boolean(t)


def _lengths(table) -> np.ndarray:
    """(n,) response tokens of each row (rows/response.py's rule), NaN without a column to count."""
    if not response_length_columns(table.column_names):
        return np.full(table.num_rows, np.nan)
    return np.asarray(response_lengths(table)[0], dtype=np.float64)


def _read(paths: list[str], wanted: list[str]):
    import pyarrow as pa

    tables = []
    for path in paths:
        f = storage.open_parquet(path)
        names = [n for n in wanted if n in f.schema_arrow.names]
        tables.append(f.read(columns=names))
    return pa.concat_tables(tables, promote_options="default") if tables else None


def _is_table(output: str) -> bool:
    """An --incremental Delta table (on an object store `_delta_log/` is a prefix, no object)."""
    from rescore.transforms.files.delta_table import is_table

    return is_table(output)


def read_run(output: str) -> RunData:
    """RunData of the Parquet in `output`, reading only the columns the charts use."""
    data = RunData()
    scored = storage.list_dir(output, SCORED_FILES)
    table = None
    if scored:
        schema = storage.open_parquet(scored[0]).schema_arrow
    elif _is_table(output):  # an --incremental table: its current rows
        from rescore.pipelines.load import load_scored

        table = load_scored(output)
        schema = table.schema
    if scored or table is not None:
        extra = [f.name for f in schema if f.name not in KNOWN_COLUMNS and _numeric_scalar(f.type)]
        length_cols = response_length_columns(schema.names)
        wanted = ["batch", "task", "reward", "score", COPY_INDEX, *length_cols, *extra, *AUDIT_NAMES]
        if table is None:
            table = _read(scored, wanted)
        else:
            table = table.select([n for n in wanted if n in table.column_names])
        if COPY_INDEX in table.column_names:  # copies repeat their originals: leave them out
            import pyarrow.compute as pc

            table = table.filter(pc.equal(table[COPY_INDEX], 0))
        data.batch = np.asarray(table["batch"].to_numpy(), dtype=np.int64)
        data.task = np.asarray(table["task"].to_numpy(zero_copy_only=False))
        data.reward = np.asarray(table["reward"].to_numpy(zero_copy_only=False), dtype=np.float64)
        if "score" in table.column_names:
            data.score = np.asarray(table["score"].to_numpy(zero_copy_only=False), dtype=np.float64)
        else:
            data.score = np.full(table.num_rows, np.nan)
        data.length = _lengths(table)
        data.extra = {n: np.asarray(table[n].to_numpy(zero_copy_only=False), dtype=np.float64) for n in extra}
        data.audit = {
            n: np.asarray(table[n].to_numpy(zero_copy_only=False), dtype=np.float64) for n in AUDIT_NAMES if n in table.column_names
        }
    filtered = storage.list_dir(output, FILTERED_FILES)
    if filtered:
        data.has_filtered_files = True
        table = _read(filtered, ["batch", "task", "reward", FILTER_REASON])
        missing = [c for c in ("batch", "task", "reward", FILTER_REASON) if c not in table.column_names]
        if missing:
            raise ReportError(f"{output}: its filtered-*.parquet lack {', '.join(missing)}: not files Rescore wrote")
        data.filtered_batch = np.asarray(table["batch"].to_numpy(), dtype=np.int64)
        data.filtered_task = np.asarray(table["task"].to_numpy(zero_copy_only=False))
        data.filtered_reward = np.asarray(table["reward"].to_numpy(zero_copy_only=False), dtype=np.float64)
        reasons, counts = np.unique(np.asarray(table[FILTER_REASON].to_numpy(zero_copy_only=False), dtype=str), return_counts=True)
        data.filter_reasons = dict(zip(reasons.tolist(), counts.tolist()))
    return data


def load_metrics(output: str) -> dict[str, Any]:
    path = storage.join(output, METRICS)
    if not storage.exists(path):
        if _is_table(output):
            return incremental_metrics(output)
        raise ReportError(f"{output} holds no metrics.json: not a Rescore output directory")
    return json.loads(storage.read_text(path))


def incremental_metrics(output: str) -> dict[str, Any]:
    """A metrics document for an --incremental table as it stands: every batch's entry from the
    committed run that last scored it (runs' metrics.json in _rescore/runs/, ordered by the table
    version each committed), for the batches the table holds now (and those whose last scoring
    wrote no row); totals summed over them. The run fields (strategy, parameters) are the last
    committed run's."""
    from rescore.pipelines.load import load_scored

    committed = []
    for path, _ in storage.match(storage.join(output, INCREMENTAL_WORK, "runs", "*", METRICS)):
        try:
            doc = json.loads(storage.read_text(path))
        except (OSError, ValueError):
            continue
        version = (doc.get("incremental") or {}).get("table_version")
        if isinstance(version, int) and "batches" in doc:
            committed.append((version, doc))
    if not committed:
        raise ReportError(f"{output} is an incremental table whose runs left no metrics.json in "
                          f"{INCREMENTAL_WORK}/runs/ (rescore show describes the table)")
    committed.sort(key=lambda vd: vd[0])
    current = set(load_scored(output, columns=["batch"])["batch"].to_pylist())
    latest: dict[Any, dict] = {}
    for _, doc in committed:
        for entry in doc["batches"]:
            if entry.get("batch") is not None:
                latest[entry["batch"]] = entry
    batches = [latest[b] for b in sorted(latest) if b in current or not latest[b].get("rows_written")]
    last = committed[-1][1]
    return {
        **last,
        "output": output,
        "batches": batches,
        "totals": _summed(batches),
        "incremental_runs": len(committed),
        "table_version": committed[-1][0],
    }


def _summed(entries: list[dict]) -> dict[str, Any]:
    """Per-batch metrics added up: counts summed (nested ones too); a `.../mean` field is the
    mean weighted by each batch's groups."""
    total: dict[str, Any] = {}
    keys = [k for e in entries for k in e if k != "batch"]
    for key in dict.fromkeys(keys):
        values = [e[key] for e in entries if key in e and e[key] is not None]
        if key.endswith("/mean"):
            weights = [e.get("groups") or 0 for e in entries if key in e and e[key] is not None]
            total[key] = (sum(v * w for v, w in zip(values, weights)) / sum(weights)) if sum(weights) else None
        elif values and all(isinstance(v, dict) for v in values):
            total[key] = _summed(values)
        elif values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            total[key] = sum(values)
    return total


def load(output: str) -> tuple[dict[str, Any], np.ndarray]:
    """(metrics.json, the written scores without nulls) of a finished run."""
    doc = load_metrics(output)
    return doc, read_run(output).scores


def batch_entries(doc) -> list[dict]:
    """metrics.json's per-batch entries (those of a batch; not a run's unbatched entry)."""
    return [b for b in doc["batches"] if b["batch"] is not None]


def _task_codes(task) -> np.ndarray:
    """(n,) int64 codes of task ids, equal exactly where the ids are equal (ints or strings,
    any characters: no id is turned into text and joined to another)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(task, (pa.Array, pa.ChunkedArray)):
        array = task
    else:
        task = np.asarray(task)
        array = pa.array(task.tolist() if task.dtype == object else task)
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return np.asarray(pc.dictionary_encode(array).indices.to_numpy(zero_copy_only=False), dtype=np.int64)


def group_table(batch: np.ndarray, task, reward: np.ndarray):
    """(batch of each group, rows, min reward, max reward) over the (batch, task) groups, in
    (batch, task code) order. A group is the pair itself, (batch, task code) as two integers:
    never a key built from text, where (1, 23) and (12, 3) could meet."""
    if not len(batch):
        z = np.zeros(0)
        return z.astype(np.int64), z.astype(np.int64), z, z
    pairs = np.stack([np.asarray(batch, dtype=np.int64), _task_codes(task)], axis=1)
    uniq, inverse, counts = np.unique(pairs, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    reward = np.asarray(reward, dtype=np.float64)
    lo = np.full(len(uniq), np.inf)
    hi = np.full(len(uniq), -np.inf)
    np.minimum.at(lo, inverse, reward)
    np.maximum.at(hi, inverse, reward)
    return uniq[:, 0].copy(), counts.astype(np.int64), lo, hi


def _all_tasks(data: RunData):
    """The task ids of the written and the filtered rows as one array (one type)."""
    import pyarrow as pa

    parts = [pa.array(t.tolist() if t.dtype == object else t) for t in (data.task, data.filtered_task) if len(t)]
    if not parts:
        return pa.array([], pa.int64())
    return pa.concat_arrays([p.cast(parts[0].type) for p in parts])


@dataclass
class GroupCounts:
    """Per batch, over the (batch, task) groups in the output (written and, with
    --keep-filtered, filtered rows): groups, groups solved by every run, by none."""

    batch: np.ndarray
    groups: np.ndarray
    all_solved: np.ndarray
    none_solved: np.ndarray
    sizes: dict[int, int]
    """rows in a group -> groups of that size."""


def group_counts(data: RunData, solved_at: float) -> GroupCounts:
    gb, rows, lo, hi = group_table(
        np.concatenate([data.batch, data.filtered_batch]), _all_tasks(data),
        np.concatenate([data.reward, data.filtered_reward]),
    )
    ids, at = np.unique(gb, return_inverse=True)
    at = at.reshape(-1)
    groups = np.bincount(at, minlength=len(ids))
    all_solved = np.bincount(at, weights=(lo >= solved_at), minlength=len(ids)).astype(np.int64)
    none_solved = np.bincount(at, weights=(hi < solved_at), minlength=len(ids)).astype(np.int64)
    sizes, counts = np.unique(rows, return_counts=True)
    return GroupCounts(ids, groups, all_solved, none_solved, dict(zip(sizes.tolist(), counts.tolist())))


PASS_RATE_BINS = np.linspace(0.0, 1.0, 11)
"""Ten pass-rate bins of width 0.1; the last holds 1.0 (np.histogram closes the last bin)."""


def group_pass_rates(batch: np.ndarray, task: np.ndarray, reward: np.ndarray, solved_at: float):
    """(batch of each (batch, task) group, its pass rate: the share of rows with reward >= solved_at)."""
    if not len(batch):
        return np.zeros(0, np.int64), np.zeros(0)
    keys = np.char.add(np.char.add(batch.astype(str), "\x00"), task.astype(str))
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    passes = np.bincount(inverse, weights=(reward >= solved_at).astype(float), minlength=len(counts))
    gb = np.zeros(len(counts), np.int64)
    gb[inverse] = batch
    return gb, passes / counts


def group_sizes(data: RunData) -> tuple[np.ndarray, str]:
    """(rows of each group, what they count): the (batch, task) groups in the output, or with
    --audit-columns and no filtered files, each group's size as read (before any filter)."""
    _, rows, _, _ = group_table(
        np.concatenate([data.batch, data.filtered_batch]), _all_tasks(data), np.concatenate([data.reward, data.filtered_reward])
    )
    if "group_size" in data.audit and not data.has_filtered_files:
        _, _, lo, _ = group_table(data.batch, _all_tasks(data), data.audit["group_size"])
        return lo.astype(np.int64), "rows per group as read (audit column group_size)"
    return rows, "rows per (batch, task) group in the output"


OFFPOLICY_KEYS = (
    "kl", "k3_kl", "training_ppl", "rollout_ppl", "ppl_ratio", "log_ppl_diff", "log_ppl_abs_diff",
    "log_ppl_diff_max", "log_ppl_diff_min", "chi2_token", "chi2_seq", "rollout_is_eff_sample_size",
    "rollout_is_mean", "rollout_is_std", "rollout_is_ratio_fraction_high", "rollout_is_ratio_fraction_low",
)
"""The per-batch off-policy diagnostics the report shows (metrics.json `rollout_correction`)."""


def offpolicy_batches(doc) -> list[tuple[int, dict]]:
    """(batch, its `rollout_correction` metrics) of each batch that has them, in batch order."""
    return [(b["batch"], b["rollout_correction"]) for b in batch_entries(doc) if isinstance(b.get("rollout_correction"), dict)]
