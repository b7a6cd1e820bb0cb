"""Inputs that change under a run: a file rewritten between the two reads, or touched after every
read, fails the run (exit 1, one line naming it) and publishes nothing."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_runs import data, finish, one_error, start, wait_for  # noqa: F401  (data: fixture)
from data import random_rows, write_parquet


@pytest.mark.slow
def test_an_input_rewritten_between_the_two_reads_fails_and_publishes_nothing(data, tmp_path):
    inp = tmp_path / "in"
    glob = write_parquet(random_rows(seed=13, batches=4), str(inp), files=3, row_group_size=6)
    out, pause = str(tmp_path / "out"), tmp_path / "pause"
    pause.mkdir()
    proc = start("--input", glob, "--output", out, "--strategy", "grpo", fault=f"pause_readback:{pause}")
    wait_for(pause / "paused")
    victim = str(inp / "part-1.parquet")
    table = pq.read_table(victim)  # same rows, same row count, rewards reversed
    table = table.set_column(table.schema.get_field_index("reward"), "reward", pa.array(table["reward"].to_pylist()[::-1]))
    pq.write_table(table, victim, row_group_size=6)
    (pause / "resume").touch()
    code, lines = finish(proc)
    line = one_error(lines)
    assert code == 1 and victim in line and "changed while the run was reading it" in line
    assert not os.path.exists(os.path.join(out, "_SUCCESS"))
    assert not [n for n in os.listdir(out) if n.startswith(("scored-", "rejected-"))]


@pytest.mark.slow
def test_an_input_changed_after_every_read_still_fails_before_publishing(data, tmp_path):
    inp = tmp_path / "in"
    glob = write_parquet(random_rows(seed=13, batches=4), str(inp), files=3, row_group_size=6)
    out, pause = tmp_path / "out", tmp_path / "pause"
    pause.mkdir()
    proc = start("--input", glob, "--output", str(out), "--strategy", "grpo", fault=f"pause_finalize:{pause}")
    wait_for(pause / "paused")
    victim = inp / "part-2.parquet"
    os.utime(victim)  # even a touch: the scores were computed from a file that is no longer there
    (pause / "resume").touch()
    code, lines = finish(proc)
    line = one_error(lines)
    assert code == 1 and str(victim) in line and "changed while the run was reading it" in line
    assert not (out / "_SUCCESS").exists() and not [n for n in os.listdir(out) if n.startswith(("scored-", "rejected-"))]
