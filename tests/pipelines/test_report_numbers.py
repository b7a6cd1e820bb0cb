"""Every number on the report page equals what a polars query over the run's own files gives
(issue 28, defect 4: task groups were keyed by str(batch) + NUL + str(task), the NUL was lost,
and (1, 23) met (12, 3) once a run had 10 batches). Runs of 1, 12 and 1,000 batches, integer
and string task ids; the tasks 3 and 23 are in every batch, so the old key merged groups."""

import glob
import html
import json
import os
import re

import numpy as np
import polars as pl
import pytest
from data import write_parquet

from rescore.pipelines import report

TASKS = (3, 23)


def _rows(batches: int, string_tasks: bool) -> list[dict]:
    rows = []
    for b in range(batches):
        for t in TASKS:
            n = 2 + (b + t) % 3
            kind = (b * 7 + t) % 4
            rewards = {0: [1.0] * n, 1: [0.0] * n, 2: [1.0, 0.0] + [1.0] * (n - 2), 3: [0.5, 1.0] + [0.25] * (n - 2)}[kind]
            for r, reward in enumerate(rewards):
                rows.append({
                    "batch": b, "task": f"{t}" if string_tasks else t, "run": r, "step": 0, "reward": reward,
                    "tokens": [1, 2, 3, 4], "prompt_length": 1, "logprobs": [-0.5] * 3, "action_mask": [True] * 3,
                    "note": "",
                })
    rows.append(dict(rows[0], run=99, reward=float("nan")))  # one rejected row
    return rows


def _tables(page: str) -> dict[str, list[list[str]]]:
    out = {}
    for name, body in re.findall(r'<table id="(\w+)"[^>]*>(.*?)</table>', page, flags=re.S):
        out[name] = [[html.unescape(c.replace("<wbr>", "")) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, flags=re.S)]
                     for row in re.findall(r"<tr>(.*?)</tr>", body, flags=re.S)]
    return out


def _num(text: str):
    text = text.replace(",", "")
    return None if text == "—" else (int(text) if re.fullmatch(r"-?\d+", text) else float(text))


def _check_page(out: str) -> None:
    report.write_report(out)
    page = open(os.path.join(out, "report.html"), encoding="utf-8").read()
    tables = _tables(page)

    def frame(kind):
        paths = sorted(glob.glob(os.path.join(out, f"{kind}-*.parquet")))
        return pl.concat([pl.read_parquet(p) for p in paths], how="diagonal_relaxed") if paths else None

    scored, filtered, rejected = frame("scored"), frame("filtered"), frame("rejected")
    rows = pl.concat([f.select("batch", "task", "reward") for f in (scored, filtered) if f is not None])
    groups = rows.group_by("batch", "task").agg(
        n=pl.len(), lo=pl.col("reward").min(), hi=pl.col("reward").max(), mean=pl.col("reward").mean()
    )
    per_batch = groups.group_by("batch").agg(
        groups=pl.len(), all_solved=(pl.col("lo") >= 1.0).sum(), none_solved=(pl.col("hi") < 1.0).sum(),
        zero_std=(pl.col("lo") == pl.col("hi")).sum(), mean=pl.col("mean").mean(),
    ).sort("batch")
    filtered_rows = filtered.group_by("batch").len() if filtered is not None else None
    n_rejected = 0 if rejected is None else rejected.height

    # the groups and sizes tables: exactly the polars numbers
    want = [[b, g, a, n] for b, g, a, n in per_batch.select("batch", "groups", "all_solved", "none_solved").iter_rows()]
    assert [[_num(c) for c in r] for r in tables["groups"][1:]] == want
    sizes = groups.group_by("n").len().sort("n")
    assert [[_num(c) for c in r] for r in tables["sizes"][1:]] == [list(r) for r in sizes.iter_rows()]

    # totals
    totals = {r[0]: _num(r[1]) for r in tables["totals"]}
    assert totals["rows_written"] == totals["rows_written_original"] == scored.height
    assert totals["rows_filtered"] == (0 if filtered is None else filtered.height)
    assert totals["rows_rejected"] == n_rejected
    assert totals["rows_read"] == scored.height + totals["rows_filtered"] + n_rejected
    assert totals["groups"] == groups.height
    assert totals["groups_zero_std"] == int(per_batch["zero_std"].sum())
    assert totals["groups_filtered"] == groups.height - scored.select("batch", "task").unique().height
    assert totals["group_advantages/reward_mean/mean"] == pytest.approx(float(groups["mean"].mean()), rel=1e-5)

    # the per-batch table
    head = tables["batches"][0]
    got = [dict(zip(head, map(_num, r))) for r in tables["batches"][1:]]
    got = [g for g in got if g["batch"] is not None]
    assert [g["batch"] for g in got] == per_batch["batch"].to_list()
    written = dict(scored.group_by("batch").len().iter_rows())
    dropped = dict(filtered_rows.iter_rows()) if filtered_rows is not None else {}
    for g, (b, n_groups, _, _, zero, mean) in zip(got, per_batch.iter_rows()):
        assert g["groups"] == n_groups and g["groups_zero_std"] == zero
        assert g["rows_written"] == written.get(b, 0) and g["rows_filtered"] == dropped.get(b, 0)
        assert g["reward_mean/mean"] == pytest.approx(mean, rel=1e-5)
    reasons = {r[0]: _num(r[1]) for r in tables.get("reasons", [])}
    doc = json.load(open(os.path.join(out, "metrics.json")))
    assert sum(doc["totals"]["reject_reasons"].values()) == n_rejected
    assert reasons == {} or sum(reasons.values()) == n_rejected


@pytest.mark.slow
@pytest.mark.parametrize("string_tasks", [False, True], ids=["int-tasks", "string-tasks"])
@pytest.mark.parametrize("batches", [1, 12, pytest.param(1000, marks=pytest.mark.slow)])
def test_report_numbers_equal_a_polars_query(tmp_path, batches, string_tasks):
    from rescore.pipelines.cli import run

    glob_ = write_parquet(_rows(batches, string_tasks), str(tmp_path / "in"), files=2, row_group_size=500)
    out = str(tmp_path / "out")
    run(["--input", glob_, "--output", out, "--runner=FnApiRunner", "--quiet", "--keep-filtered",
         "--strategy", "reward_variance,grpo"])
    _check_page(out)


def test_group_keys_are_pairs_not_text():
    """(1, 23) and (12, 3) are two groups; so are the string tasks 'a' and 'a\\0'."""
    gb, rows, lo, hi = report.group_table(np.array([1, 1, 12, 12, 12]), np.array([23, 23, 3, 3, 3]), np.array([0, 1, 1, 1, 1.0]))
    assert gb.tolist() == [1, 12] and rows.tolist() == [2, 3] and lo.tolist() == [0, 1] and hi.tolist() == [1, 1]
    gb, rows, _, _ = report.group_table(np.array([1, 1, 12]), np.array(["23", "23", "3"], dtype=object), np.zeros(3))
    assert rows.tolist() == [2, 1]
    _, rows, _, _ = report.group_table(np.array([0, 0, 0]), np.array(["a", "a\0", "a\0"], dtype=object), np.zeros(3))
    assert sorted(rows.tolist()) == [1, 2]
