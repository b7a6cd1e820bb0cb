"""--group-filter MODULE:FUNCTION through the whole job: the rows it drops are filtered with its
reason (a function that raises drops its group, the run goes on), GRPO scores the kept groups;
a spec that does not import is one line and exit 2 before any work. The filter's own behaviour
is tests/strategies/test_group_filter.py."""

from __future__ import annotations

import pytest
from batched import rescore_process
from test_group_filter import user_module  # noqa: F401  (fixture)


@pytest.mark.slow
def test_cli_bad_spec_exits_2_with_one_line_before_any_work(tmp_path):
    out = tmp_path / "out"
    proc = rescore_process("--input", str(tmp_path / "none" / "*.parquet"), "--output", str(out),
                           "--strategy", "grpo", "--group-filter", "no_such_module_xyz:keep", "--runner=FnApiRunner", "--quiet")
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rescore: error: --group-filter no_such_module_xyz:keep: cannot import"), proc.stderr
    assert not out.exists()


def test_group_filter_through_the_job(user_module, rescore, tmp_path):
    from data import SCHEMA_INT_TASK, by_id, read_output, write_parquet

    groups = {0: [0.0, 1.0], 1: [1.0, 1.0], 2: [1.0, 9.0], 3: [0.0, 0.5, 1.0]}
    data = [{"batch": 0, "task": t, "run": r, "step": 0, "reward": x, "tokens": [1, 2], "prompt_length": 1,
             "logprobs": [-0.5], "action_mask": [True], "note": None} for t, g in groups.items() for r, x in enumerate(g)]
    glob = write_parquet(data, str(tmp_path / "in"), files=2, schema=SCHEMA_INT_TASK)
    doc, out = rescore(glob, "--strategy", "grpo", "--group-filter", "my_group_filters:spread", "--keep-filtered")
    scored, filtered = by_id(read_output(out)), by_id(read_output(out, "filtered"))
    assert {k[1] for k in scored} == {0, 3} and {k[1] for k in filtered} == {1, 2}
    assert {k[1]: v["filter_reason"] for k, v in filtered.items()} == {
        1: "group_filter: all 2 rewards equal", 2: "group_filter: raised ValueError: reward out of range"}
    assert doc["totals"]["rows_filtered"] == 4
    assert scored[(0, 3, 2, 0)]["score"] == pytest.approx(1.0, abs=1e-5)  # GRPO over the kept group: (1 - 0.5) / 0.5
