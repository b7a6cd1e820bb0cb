"""The report's off-policy chart and table: drawn from metrics.json `rollout_correction` after a
correction run, every per-batch value in the table as metrics.json has it; absent without one."""

from __future__ import annotations

import json
import os
import random
import re

import pyarrow as pa
import pytest
from data import SCHEMA_INT_TASK, random_rows, write_parquet

from rescore.pipelines.report import OFFPOLICY_KEYS, main, offpolicy_batches
from rescore.pipelines.report_page import fmt as _fmt

SCHEMA = SCHEMA_INT_TASK.append(pa.field("logprobs_original", pa.list_(pa.float32())))


def _input(tmp_path) -> str:
    rows = random_rows(5, batches=3, max_tasks=4)
    rng = random.Random(5)
    for r in rows:
        r["logprobs_original"] = [min(0.0, float(f"{lp + rng.gauss(0, 0.3):.6g}")) for lp in r["logprobs"]]  # log-probs: <= 0
    return write_parquet(rows, str(tmp_path / "in"), files=1, schema=SCHEMA)


@pytest.mark.slow
def test_the_report_shows_the_offpolicy_diagnostics(tmp_path, rescore):
    doc, out = rescore(_input(tmp_path), "--strategy", "decoupled_token_is,grpo")
    entries = offpolicy_batches(doc)
    assert [b for b, _ in entries] == sorted(b["batch"] for b in doc["batches"] if b["batch"] is not None)
    assert main([out]) == 0
    assert open(os.path.join(out, "report-offpolicy.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    page = open(os.path.join(out, "report.html"), encoding="utf-8").read()
    table = re.search(r'<table id="offpolicy"[^>]*>(.*?)</table>', page, re.S).group(1).replace("<wbr>", "")  # headers may wrap
    lines = re.findall(r"<tr>(.*?)</tr>", table, re.S)
    head = re.findall(r"<th>(.*?)</th>", lines[0])
    assert head[0] == "batch" and set(head[1:]) <= set(OFFPOLICY_KEYS) and {"kl", "k3_kl", "chi2_token", "chi2_seq"} <= set(head)
    assert {"rollout_is_eff_sample_size", "rollout_is_mean", "rollout_is_ratio_fraction_high"} <= set(head)  # decoupled_token_is has rollout_is weights
    for line, (batch, metrics) in zip(lines[1:], entries):
        cells = re.findall(r"<td>(.*?)</td>", line)
        assert cells == [_fmt(batch)] + [_fmt(metrics.get(k)) for k in head[1:]]
    total = re.findall(r"<td>(.*?)</td>", lines[-1])
    assert total == [_fmt(json.loads(open(os.path.join(out, "metrics.json")).read())["totals"]["rollout_correction"].get(k)) for k in head[1:]]
    assert any(float(c) != 0.0 for c in re.findall(r"<td>(.*?)</td>", lines[1])[1:3])  # the drift is really there


@pytest.mark.slow
def test_no_offpolicy_chart_without_a_correction(tmp_path, rescore):
    _, out = rescore(_input(tmp_path), "--strategy", "grpo")
    assert main([out]) == 0
    assert not os.path.exists(os.path.join(out, "report-offpolicy.png"))
    assert 'id="offpolicy"' not in open(os.path.join(out, "report.html"), encoding="utf-8").read()
