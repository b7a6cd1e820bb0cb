"""Issue 40, outputs: the subcommands that write (`export`, `task-stats`, `report --to`) under
the main command's ownership rules, empty exports, the loader's trainer conventions, the
runner arguments of `task-stats`, RESCORE_* ranges. Every CLI case runs in ONE child process
(batched.run_many: real stderr, imports paid once); the rules and the loader in-process."""

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batched import ROOT, run_many

from rescore.errors import InputError
from rescore.transforms.rows import export as ex


def _row(batch, task, run, prompt, response, reward, action=None, **more):
    return {"batch": batch, "task": task, "run": run, "step": 0, "reward": float(reward), "score": float(reward),
            "tokens": prompt + response, "prompt_length": len(prompt),
            "action_mask": action if action is not None else [1] * len(response), **more}


def _finished(d, rows):
    """A finished one-shot output holding these scored rows (none: no scored file at all)."""
    os.makedirs(d)
    if rows:
        pq.write_table(pa.Table.from_pylist(rows), os.path.join(d, "scored-00000-of-00001.parquet"))
    open(os.path.join(d, "_SUCCESS"), "w").close()


def _listing(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d)) if os.path.isfile(os.path.join(d, n))}


# --- the rules, in-process ------------------------------------------------------------------------


def test_dpo_duplicates_are_the_same_prompt_chosen_and_rejected_whatever_the_task_id():
    p = [5, 6]
    rows = [_row(0, 1, 0, p, [1, 2], 1.0), _row(0, 1, 1, p, [3], 0.0),    # task 1: a pair
            _row(0, 2, 0, p, [1, 2], 1.0), _row(0, 2, 1, p, [3], 0.0),    # task 2, same prompt, same pair
            _row(0, 3, 0, [9], [1, 2], 1.0), _row(0, 3, 1, [9], [3], 0.0),  # another prompt: a new pair
            _row(0, 4, 0, p, [7], 1.0), _row(0, 4, 1, p, [7], 0.0)]       # best and worst: the same tokens
    pairs, outcome = ex.select_dpo(pa.Table.from_pylist(rows), ex.DpoRule())
    assert pairs == [(0, 1), (4, 5)]
    assert [ex.OUTCOMES[o] for o in outcome] == ["exported"] * 2 + ["duplicate"] * 2 + ["exported"] * 2 + ["duplicate"] * 2


def test_sft_duplicates_and_completion_mask_follow_the_content_and_the_action_mask():
    rows = [_row(0, 1, 0, [5], [1, 2, 3], 1.0, action=[1, 0, 1]), _row(0, 2, 0, [5], [1, 2, 3], 1.0),
            _row(0, 3, 0, [6], [1, 2, 3], 1.0, action=None)]
    rows[2]["action_mask"] = None
    table = pa.Table.from_pylist(rows)
    chosen, outcome = ex.select_sft(table, ex.SftRule("top_k"))
    assert chosen == [0, 2] and [ex.OUTCOMES[o] for o in outcome] == ["exported", "duplicate", "exported"]
    out = ex.sft_table(table, chosen, "reward")
    assert out["completion_mask"].to_pylist() == [[0, 1, 0, 1], [0, 1, 1, 1]]
    bad = pa.Table.from_pylist([_row(0, 1, 0, [5], [1, 2], 1.0, action=[1])])
    with pytest.raises(InputError, match="action_mask has 1 values for 2"):
        ex.sft_table(bad, [0], "reward")


def test_empty_exports_have_the_schema_of_full_ones():
    table = pa.Table.from_pylist([_row(0, 1, 0, [5], [1], 1.0), _row(0, 1, 1, [5], [2], 0.0)])
    for full, empty in ((ex.sft_table(table, [0], "reward"), ex.sft_table(table, [], "reward")),
                        (ex.dpo_table(table, [(0, 1)], "reward"), ex.dpo_table(table, [], "reward"))):
        assert empty.num_rows == 0 and full.num_rows == 1 and empty.schema == full.schema
    text = ex.dpo_table(table, [], "reward", decode=str)
    assert text.schema.field("chosen").type == pa.string()


# --- the torch loader: each trainer's convention ----------------------------------------------------


def _loader_table(logprobs=True):
    rows = [_row(0, 1, 0, [5, 6], [1, 2, 3], 1.0, action=[1, 0, 1], advantages=[0.5, -1.0, 2.0]),
            _row(0, 1, 1, [5], [4], 0.0, action=[1], advantages=[-0.25]),
            _row(0, 2, 0, [7], [8, 9], 0.0, action=[0, 1], advantages=[3.0, 4.0])]
    if logprobs:
        for r in rows:
            r["logprobs"] = [-0.5] * (len(r["tokens"]) - r["prompt_length"])
    return pa.Table.from_pylist(rows)


def test_trl_layout_is_trls_own():
    torch = pytest.importorskip("torch")
    from rescore.torch import ScoredBatches

    (b,) = list(ScoredBatches(_loader_table(), batch_size=3, layout="trl"))
    # TRL 1.16 (_generate_and_score_completions): completion_mask = every real completion token,
    # tool_mask = 1 on model tokens, 0 on tool tokens, right-padded with 1; loss mask = the product.
    assert b["completion_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert b["tool_mask"].tolist() == [[1, 0, 1], [1, 1, 1], [0, 1, 1]]
    assert b["num_items_in_batch"].item() == 4 == (b["completion_mask"] * b["tool_mask"]).sum().item()
    assert b["num_items_in_batch"].dim() == 0
    assert b["advantages"].tolist() == [[0.5, -1.0, 2.0], [-0.25, 0, 0], [3.0, 4.0, 0]]  # per token
    attention = torch.cat([b["prompt_mask"], b["completion_mask"]], dim=1)  # what TRL's forward pass attends to
    assert attention.sum(1).tolist() == [5, 2, 3]
    assert b["old_per_token_logps"].shape == (3, 3)


def test_old_log_probs_are_in_every_batch_or_in_none():
    from rescore.torch import ScoredBatches

    full = _loader_table()
    for layout, key in (("verl", "old_log_probs"), ("trl", "old_per_token_logps")):
        assert all(key in b for b in ScoredBatches(full, batch_size=1, layout=layout))
        assert not any(key in b for b in ScoredBatches(_loader_table(False), batch_size=1, layout=layout))
        assert not any(key in b for b in ScoredBatches(full, batch_size=1, layout=layout, old_log_probs=False))
    rows = full.to_pylist()
    rows[1]["logprobs"] = None
    holed = pa.Table.from_pylist(rows)
    with pytest.raises(ValueError, match="1 of 3 scored rows have no logprobs"):
        ScoredBatches(holed, batch_size=1)
    keys = [frozenset(b) for b in ScoredBatches(holed, batch_size=1, old_log_probs=False)]
    assert len(set(keys)) == 1
    rows[1]["logprobs"], rows[1]["advantages"] = [-0.5], [float("nan")]
    with pytest.raises(ValueError, match="advantages holds a value that is not a finite float32"):
        list(ScoredBatches(pa.Table.from_pylist(rows), batch_size=3))


# --- the commands, in one child ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("outputs")
    src = str(tmp / "src")
    _finished(src, [_row(b, t, r, [100 + t], [t, r, 1 + r], reward=r % 2 + b, action=[1, 0, 1])
                    for b in range(2) for t in range(3) for r in range(2)])
    _finished(str(tmp / "empty"), [])
    _finished(str(tmp / "ties"), [_row(0, 1, r, [5], [r], 1.0) for r in range(3)])
    exp = tmp / "exp"
    exp.mkdir()
    pq.write_table(pa.Table.from_pylist([_row(0, t, r, [1], [2], r % 2) for t in range(2) for r in range(2)]),
                   str(exp / "part-0.parquet"))
    user = tmp / "user"
    user.mkdir()
    (user / "dpo.parquet").write_bytes(b"the user's own file")
    (tmp / "plain_file").write_text("x")
    os.symlink(src, str(tmp / "link_to_src"))
    charts = tmp / "charts"
    charts.mkdir()
    (charts / "report-reward.png").write_bytes(b"the user's chart")
    (tmp / "table" / "_delta_log").mkdir(parents=True)  # an incremental output
    before = {"src": _listing(src), "user": _listing(str(user)), "charts": _listing(str(charts))}
    e = ["export"]
    runs = [
        e + [str(tmp / "empty"), "--output", str(tmp / "e_sft"), "--format", "sft", "--quiet"],                  # 0
        e + [str(tmp / "empty"), "--output", str(tmp / "e_dpo"), "--format", "dpo", "--quiet"],                  # 1
        e + [str(tmp / "ties"), "--output", str(tmp / "t_dpo"), "--format", "dpo", "--quiet"],                   # 2
        e + [src, "--output", str(user), "--format", "sft"],                                                     # 3
        e + [src, "--output", str(tmp / "link_to_src"), "--format", "sft", "--overwrite"],                       # 4
        e + [src, "--output", str(tmp / "plain_file"), "--format", "sft"],                                       # 5
        e + [src, "--output", str(tmp / "own"), "--format", "dpo", "--quiet"],                                   # 6
        e + [src, "--output", str(tmp / "own"), "--format", "sft", "--overwrite", "--quiet"],                    # 7
        e + [src, "--output", str(tmp / "src" / "inside"), "--format", "sft"],                                   # 8
        ["task-stats", "--input", str(exp), "--output", str(tmp / "ts1"), "--band", "0.2,0.8",
         "--prompt-list", str(tmp / "plain_file" / "x.txt")],                                                    # 9
        ["task-stats", "--input", str(exp), "--output", str(tmp / "ts2"), "--runner", "FlinkRunner",
         "--flink_master", "flink.example.com:8081"],                                                            # 10
        ["task-stats", "--input", str(exp), "--output", str(tmp / "ts3"), "--runner", "FnApiRunner", "--quiet"],  # 11
        ["task-stats", "--input", str(exp), "--output", str(exp / "stats")],                                     # 12
        ["task-stats", "--input", str(exp), "--output", str(tmp / "own"), "--quiet"],                            # 13
        ["report", src, "--to", str(charts)],                                                                    # 14
        e + [src, "--output", str(tmp / "locked"), "--format", "sft"],                                          # 15
        (["--input", str(exp), "--output", str(tmp / "r1"), "--strategy", "grpo"], {"RESCORE_READ_AHEAD_MB": "1e308"}),  # 16
        (["--input", str(exp), "--output", str(tmp / "r2"), "--strategy", "grpo"],
         {"RESCORE_READ_AHEAD_MB": None, "RESCORE_PROGRESS_SECONDS": "1e-320"}),                                 # 17
        (e + [src, "--output", str(tmp / "table"), "--format", "sft"], {"RESCORE_PROGRESS_SECONDS": None}),      # 18
    ]
    from rescore.transforms.files import lock

    with lock.acquire(str(tmp / "locked")):  # another export holds this one
        results = run_many(tmp / "logs", runs)
    return tmp, results, before


def _one_line_exit_2(result, *words):
    code, err = result
    assert code == 2 and err.startswith("rescore: error: ") and err.count("\n") == 1, result
    for w in words:
        assert w in err, (w, err)


def test_an_empty_export_is_a_valid_empty_parquet_file_with_the_schema(commands):
    tmp, results, _ = commands
    assert [c for c, _ in results[:3]] == [0, 0, 0], results[:3]
    for d, name in (("e_sft", "sft.parquet"), ("e_dpo", "dpo.parquet"), ("t_dpo", "dpo.parquet")):
        table = pq.read_table(str(tmp / d / name))
        assert table.num_rows == 0 and "prompt_ids" in table.column_names, d
        doc = json.loads((tmp / d / "export.json").read_text())
        assert doc["records"] == 0
    assert json.loads((tmp / "t_dpo" / "export.json").read_text())["rows"]["tie"] == 3


def test_export_never_touches_what_it_did_not_write(commands):
    tmp, results, before = commands
    _one_line_exit_2(results[3], "dpo.parquet", "did not write")
    _one_line_exit_2(results[4], "source")
    _one_line_exit_2(results[5], "is a file")
    _one_line_exit_2(results[8], "source")
    _one_line_exit_2(results[18], "another Rescore output", "_delta_log")
    assert os.listdir(tmp / "table") == ["_delta_log"]
    assert _listing(str(tmp / "user")) == before["user"]
    assert _listing(str(tmp / "src")) == before["src"] and not os.path.exists(tmp / "src" / "inside")
    assert results[6][0] == 0 and results[7][0] == 0, results[6:8]
    # its own earlier export of the other kind is Rescore's, listed in the ledger: replaced whole
    assert sorted(os.listdir(tmp / "own")) == ["_SUCCESS", "_rescore_files.json", "export.json", "sft.parquet"]


def test_task_stats_checks_every_target_and_parses_runner_arguments_like_the_run_command(commands):
    tmp, results, _ = commands
    _one_line_exit_2(results[9], "--prompt-list", "is a file")
    assert not os.path.exists(tmp / "ts1")  # before any work
    _one_line_exit_2(results[10], "FlinkRunner's workers", "--shared-filesystem")
    assert results[11][0] == 0, results[11]
    assert pq.read_table(str(tmp / "ts3" / "task_stats.parquet")).num_rows == 2
    _one_line_exit_2(results[12], "source")
    _one_line_exit_2(results[13], "holds an export (written by `rescore export`)")  # an export's directory is not task statistics


def test_report_to_a_directory_of_the_users_files_is_refused_before_work(commands):
    tmp, results, before = commands
    _one_line_exit_2(results[14], "report-reward.png")
    assert _listing(str(tmp / "charts")) == before["charts"]


@pytest.mark.parametrize("value", ["99999999999999999999999", "-2"])
def test_rescore_env_values_are_range_checked_like_flags(value):
    proc = subprocess.run([sys.executable, "-c", "from rescore.pipelines.cli import keep_freed_pages; keep_freed_pages()"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**os.environ, "PYTHONPATH": ROOT, "RESCORE_ARROW_DECAY_MS": value,
                               "ARROW_DEFAULT_MEMORY_POOL": "jemalloc"})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("rescore: error: RESCORE_ARROW_DECAY_MS must be"), proc.stderr


def test_one_export_at_a_time_and_env_values_in_range(commands):
    tmp, results, _ = commands
    _one_line_exit_2(results[15], "being written by another run")
    assert not (tmp / "locked" / "sft.parquet").exists()
    _one_line_exit_2(results[16], "RESCORE_READ_AHEAD_MB must be at most")  # was exit 1 after the work
    _one_line_exit_2(results[17], "RESCORE_PROGRESS_SECONDS must be at least 0.1 seconds")  # was a line per loop
    assert not (tmp / "r1").exists() and not (tmp / "r2").exists()
