"""Bad input, row accounting, the reject budget, crash safety and fault injection.

Each bad-input class goes through `main()` as a user runs it: an exit code, a one-line message
and no traceback for anything a user could cause.
"""

import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import reference
from conftest import RUNNER
from data import SCHEMA_INT_TASK, by_id, random_rows, read_output, write_parquet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = [(k, "ascending") for k in ("batch", "task", "run", "step")]


def main(capsys, *args):
    from rescore.pipelines.cli import main as rescore_main

    code = rescore_main([RUNNER, "--quiet", *args])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def accounting_holds(doc):
    for part in [doc["totals"], *doc["batches"]]:
        assert part["rows_read"] == part["rows_written_original"] + part["rows_filtered"] + part["rows_rejected"], part
        assert part["rows_written"] == part["rows_written_original"] + part["rows_duplicated"]


def metrics(out):
    with open(os.path.join(out, "metrics.json")) as f:
        return json.load(f)


# --- row-level problems: rejected with a reason, counted -----------------------------------


def test_each_bad_row_class_is_rejected_with_its_reason(tmp_path, capsys):
    rows = random_rows(seed=31, batches=4, max_tasks=9)
    rows = [r for r in rows if r["logprobs"]][:60]
    bad = {
        0: ("reward", float("nan"), "bad_reward: reward is NaN"),
        1: ("reward", float("inf"), "bad_reward: reward is +inf"),
        2: ("reward", float("-inf"), "bad_reward: reward is -inf"),
        3: ("reward", None, "null_value: reward is null"),
        4: ("logprobs", "longer", "length_mismatch: action_mask has"),
        5: ("action_mask", "shorter", "length_mismatch: action_mask has"),
        6: ("prompt_length", "off", "length_mismatch:"),
        7: ("tokens", None, "null_value: tokens is null"),
        8: ("logprobs", None, "null_value: logprobs is null"),
        9: ("prompt_length", -1, "bad_prompt_length: prompt_length -1"),
        10: ("batch", None, "null_value: batch is null"),
    }
    for i, (column, value, _) in bad.items():
        if value == "longer":
            rows[i][column] = rows[i][column] + [-0.5]
        elif value == "shorter":
            rows[i][column] = rows[i][column][:-1]
        elif value == "off":
            rows[i][column] += 1
        else:
            rows[i][column] = value
    # Empty lists that agree are a valid row with no response tokens.
    rows[11].update(tokens=rows[11]["tokens"][: rows[11]["prompt_length"]], logprobs=[], action_mask=[])
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=7)
    out = str(tmp_path / "out")
    code, err = main(capsys, "--input", glob, "--output", out, "--strategy", "grpo")
    assert code == 0, err
    rejected = read_output(out, "rejected").to_pylist()
    reasons = {r["note"]: r["reject_reason"] for r in rejected}
    for i, (_, _, reason) in bad.items():
        assert reasons[rows[i]["note"]].startswith(reason), (i, reasons[rows[i]["note"]])
    assert len(rejected) == len(bad)
    scored = {r["note"]: r for r in read_output(out).to_pylist()}
    assert scored[rows[11]["note"]]["advantages"] == []
    doc = metrics(out)
    accounting_holds(doc)
    assert doc["totals"]["rows_rejected"] == len(bad)
    # The row with a null batch has no batch to count under: it is listed as batch null.
    assert any(b["batch"] is None and b["rows_rejected"] == 1 for b in doc["batches"])


@pytest.mark.slow
def test_duplicate_ids_reject_every_copy(tmp_path, capsys):
    rows = random_rows(seed=32)
    rows += [dict(rows[0]), dict(rows[1]), dict(rows[1])]
    glob = write_parquet(rows, str(tmp_path / "in"))
    out = str(tmp_path / "out")
    code, err = main(capsys, "--input", glob, "--output", out, "--strategy", "grpo")
    assert code == 0, err
    rejected = read_output(out, "rejected")
    assert rejected.num_rows == 5
    assert all(r.startswith("duplicate_id: ") for r in rejected["reject_reason"].to_pylist())
    reference_out = reference.rescore(rows, "grpo")
    assert set(by_id(read_output(out))) == set(reference_out["scored"])


@pytest.mark.slow
def test_messy_input_accounting_per_batch(tmp_path, capsys):
    rows = random_rows(seed=33, batches=5)
    for i in range(0, len(rows), 9):
        rows[i]["reward"] = float("nan")
    rows += [dict(rows[1])]
    glob = write_parquet(rows, str(tmp_path / "in"), files=3, row_group_size=4)
    out = str(tmp_path / "out")
    code, err = main(capsys, "--input", glob, "--output", out, "--strategy", "reward_variance,grpo,duplicate_informative")
    assert code == 0, err
    doc = metrics(out)
    accounting_holds(doc)
    assert doc["totals"]["rows_read"] == len(rows)
    assert sum(b["rows_read"] for b in doc["batches"]) == len(rows)
    assert doc["totals"]["rows_written"] == read_output(out).num_rows


# --- file-level problems: one line before the pipeline starts --------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "field, message",
    [
        (pa.field("reward", pa.string()), "column 'reward' has type string, expected a float"),
        (pa.field("run", pa.float64()), "column 'run' has type double, expected an integer"),
        (pa.field("batch", pa.float32()), "column 'batch' has type float, expected an integer"),
    ],
)
def test_wrong_column_types_stop_the_run(tmp_path, capsys, field, message):
    rows = random_rows(seed=34)
    schema = SCHEMA_INT_TASK.set(SCHEMA_INT_TASK.get_field_index(field.name), field)
    for r in rows:
        r[field.name] = str(r[field.name]) if pa.types.is_string(field.type) else float(r[field.name])
    glob = write_parquet(rows, str(tmp_path / "in"), files=1, schema=schema)
    code, err = main(capsys, "--input", glob, "--output", str(tmp_path / "out"), "--strategy", "grpo")
    assert code == 2 and message in one_line(err)
    assert not os.path.exists(tmp_path / "out" / "_SUCCESS")


@pytest.mark.slow
def test_missing_required_column_and_unmatched_glob(tmp_path, capsys):
    rows = random_rows(seed=35)
    table = pa.Table.from_pylist(rows, schema=SCHEMA_INT_TASK).drop_columns(["run"])
    os.makedirs(tmp_path / "in")
    pq.write_table(table, tmp_path / "in" / "a.parquet")
    code, err = main(capsys, "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--strategy", "grpo")
    assert code == 2 and "a.parquet: missing required column 'run'" in one_line(err)
    code, err = main(capsys, "--input", str(tmp_path / "nothing" / "*.parquet"), "--output", str(tmp_path / "out"), "--strategy", "grpo")
    assert code == 2 and "no input files match" in one_line(err)


@pytest.mark.slow
def test_compatible_types_give_the_same_scores(tmp_path, capsys):
    rows = random_rows(seed=36)
    narrow = pa.schema(
        [
            ("batch", pa.int32()),
            ("task", pa.int16()),
            ("run", pa.int32()),
            ("step", pa.int8()),
            ("reward", pa.float32()),
            ("tokens", pa.large_list(pa.int32())),
            ("prompt_length", pa.int32()),
            ("logprobs", pa.large_list(pa.float32())),
            ("action_mask", pa.list_(pa.int8())),
            ("note", pa.large_string()),
        ]
    )
    for r in rows:
        r["reward"] = float(np.float32(r["reward"]))  # the same values in both files
    wide = write_parquet(rows, str(tmp_path / "wide"), files=1)
    for r in rows:
        r["action_mask"] = [int(m) for m in r["action_mask"]]
    thin = write_parquet(rows, str(tmp_path / "thin"), files=2, schema=narrow)
    for glob, out in ((wide, "o1"), (thin, "o2")):
        code, err = main(capsys, "--input", glob, "--output", str(tmp_path / out), "--strategy", "grpo")
        assert code == 0, err
    a, b = by_id(read_output(str(tmp_path / "o1"))), by_id(read_output(str(tmp_path / "o2")))
    assert set(a) == set(b)
    for k in a:
        assert a[k]["score"] == b[k]["score"] and a[k]["advantages"] == b[k]["advantages"]


def _truncate(path, keep=0.6):
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: int(len(data) * keep)])


@pytest.mark.slow
def test_truncated_file_names_the_file_or_is_skipped(tmp_path, capsys):
    rows = random_rows(seed=37, batches=4)
    glob = write_parquet(rows, str(tmp_path / "in"), files=3)
    broken = str(tmp_path / "in" / "part-1.parquet")
    lost = pq.read_table(broken).num_rows
    _truncate(broken)
    code, err = main(capsys, "--input", glob, "--output", str(tmp_path / "out"), "--strategy", "grpo")
    assert code == 2 and f"{broken}: not a readable Parquet file" in one_line(err)

    out = str(tmp_path / "out2")
    code, err = main(capsys, "--input", glob, "--output", out, "--strategy", "grpo", "--skip-bad-files")
    assert code == 0, err
    doc = metrics(out)
    assert [f["path"] for f in doc["skipped_files"]] == [broken]
    assert "not a readable Parquet file" in doc["skipped_files"][0]["reason"]
    assert doc["totals"]["rows_read"] == len(rows) - lost
    accounting_holds(doc)


@pytest.mark.slow
def test_only_bad_files_is_an_input_error_even_when_skipping(tmp_path, capsys):
    os.makedirs(tmp_path / "in")
    (tmp_path / "in" / "junk.parquet").write_bytes(b"not parquet at all")
    code, err = main(capsys, "--input", str(tmp_path / "in"), "--output", str(tmp_path / "o"), "--strategy", "grpo", "--skip-bad-files")
    assert code == 2 and "no readable input files" in one_line(err)


@pytest.mark.slow
def test_corrupt_data_pages_fail_naming_the_file(tmp_path, capsys):
    rows = random_rows(seed=38)
    os.makedirs(tmp_path / "in")
    path = str(tmp_path / "in" / "a.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA_INT_TASK), path, compression="zstd")
    data = bytearray(open(path, "rb").read())
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    for i in range(4, footer_start, 3):  # leave the magic and the footer alone
        data[i] = 0xFF
    open(path, "wb").write(bytes(data))
    code, err = main(capsys, "--input", path, "--output", str(tmp_path / "o"), "--strategy", "grpo")
    assert code == 1 and path in one_line(err)
    assert not os.path.exists(tmp_path / "o" / "_SUCCESS")


# --- hot key ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_hot_task_group_finishes_or_stops_at_the_cap(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n_hot = 40_000
    rewards = rng.random(n_hot)
    hot = pa.table({"batch": np.zeros(n_hot, np.int64), "task": np.zeros(n_hot, np.int64),
                    "run": np.arange(n_hot, dtype=np.int64), "reward": rewards})
    small = pa.table({"batch": np.zeros(80, np.int64), "task": np.repeat(np.arange(1, 11), 8).astype(np.int64),
                      "run": np.tile(np.arange(8), 10).astype(np.int64), "reward": rng.random(80)})
    os.makedirs(tmp_path / "in")
    pq.write_table(pa.concat_tables([hot, small]), tmp_path / "in" / "a.parquet", row_group_size=5000)
    out = str(tmp_path / "out")
    code, err = main(capsys, "--input", str(tmp_path / "in"), "--output", out, "--strategy", "grpo")
    assert code == 0, err
    t = read_output(out)
    got = t.filter(pa.compute.equal(t["task"], 0)).sort_by("run")["score"].to_numpy()
    expected = (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-6)
    assert np.allclose(got, expected, rtol=1e-5)

    code, err = main(capsys, "--input", str(tmp_path / "in"), "--output", str(tmp_path / "o2"), "--strategy", "grpo",
                     "--max-group-rows", "10000")
    line = one_line(err)
    assert code == 1 and "task group (batch=0, task=0) has 40,000 rows, more than --max-group-rows=10,000" in line
    assert not os.path.exists(tmp_path / "o2" / "_SUCCESS")


# --- reject budget ------------------------------------------------------------------------


@pytest.mark.slow
def test_reject_budget(tmp_path, capsys):
    rows = random_rows(seed=39)
    for r in rows[: int(len(rows) * 0.6)]:
        r["reward"] = float("nan")
    glob = write_parquet(rows, str(tmp_path / "in"))
    out = str(tmp_path / "out")
    code, err = main(capsys, "--input", glob, "--output", out, "--strategy", "grpo")
    line = one_line(err)
    assert code == 1 and "were rejected (bad_reward" in line and "more than --max-reject-fraction=0.5" in line
    assert not os.path.exists(os.path.join(out, "_SUCCESS"))
    assert not [p for p in os.listdir(out) if p.startswith("scored-")]
    assert read_output(out, "rejected").num_rows == int(len(rows) * 0.6)
    assert metrics(out)["failed"].startswith(f"{int(len(rows) * 0.6):,} of {len(rows):,} rows")
    # A looser budget lets the same input through; the failed run's files are cleared.
    code, err = main(capsys, "--input", glob, "--output", out, "--strategy", "grpo", "--max-reject-fraction", "0.7")
    assert code == 0, err
    assert "failed" not in metrics(out) and os.path.exists(os.path.join(out, "_SUCCESS"))
    code, err = main(capsys, "--input", glob, "--output", str(tmp_path / "x"), "--strategy", "grpo", "--max-reject-fraction", "2")
    assert code == 2 and "--max-reject-fraction must be a number from 0 to 1" in one_line(err)


# --- crash safety and faults ----------------------------------------------------------------


def _sorted_output(out):
    return read_output(out).sort_by(KEYS)


@pytest.mark.slow
def test_killed_run_leaves_no_success_and_a_rerun_is_complete(tmp_path, rescore):
    rows = random_rows(seed=40, batches=6)
    glob = write_parquet(rows, str(tmp_path / "in"), files=4, row_group_size=5)
    _, clean = rescore(glob, "--strategy", "grpo", "--shard-rows", "5", output=str(tmp_path / "clean"))

    out = tmp_path / "out"
    env = {**os.environ, "RESCORE_TEST_INJECT_FAULT": "slow_write:0.5"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rescore", "--input", glob, "--output", str(out), "--strategy", "grpo",
         "--shard-rows", "5", RUNNER],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    staging = out / "_staging"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (staging.exists() and any(staging.iterdir())):
        time.sleep(0.05)
    assert staging.exists() and any(staging.iterdir()), "the job never started writing"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (out / "_SUCCESS").exists()
    assert not [p for p in os.listdir(out) if p.startswith("scored-")]  # nothing visible before the end

    doc, _ = rescore(glob, "--strategy", "grpo", "--shard-rows", "5", output=str(out))
    assert (out / "_SUCCESS").exists() and not staging.exists()
    again = _sorted_output(str(out))
    assert again.equals(_sorted_output(clean))
    ids = list(zip(*(again[k].to_pylist() for k in ("batch", "task", "run", "step"))))
    assert len(ids) == len(set(ids))
    accounting_holds(doc)


@pytest.mark.slow
def test_a_failing_scoring_step_fails_loudly_and_a_rerun_is_correct(tmp_path, rescore, capsys, monkeypatch):
    rows = random_rows(seed=41)
    glob = write_parquet(rows, str(tmp_path / "in"))
    _, clean = rescore(glob, "--strategy", "grpo", output=str(tmp_path / "clean"))
    marker = tmp_path / "fault-marker"
    monkeypatch.setenv("RESCORE_TEST_INJECT_FAULT", f"fail_once:{marker}")
    out = str(tmp_path / "out")
    code, err = main(capsys, "--input", glob, "--output", out, "--strategy", "grpo")
    # The in-process runner does not retry a failed bundle: the job stops with the reason.
    assert code == 1 and "injected fault in ScoreGroups" in one_line(err)
    assert marker.exists() and not os.path.exists(os.path.join(out, "_SUCCESS"))
    code, err = main(capsys, "--input", glob, "--output", out, "--strategy", "grpo")
    assert code == 0, err
    assert _sorted_output(out).equals(_sorted_output(clean))
    accounting_holds(metrics(out))


@pytest.mark.slow
def test_a_finished_output_is_refused_without_overwrite(tmp_path, capsys):
    glob = write_parquet(random_rows(seed=42), str(tmp_path / "in"))
    out = str(tmp_path / "out")
    assert main(capsys, "--input", glob, "--output", out, "--strategy", "grpo")[0] == 0
    code, err = main(capsys, "--input", glob, "--output", out, "--strategy", "grpo")
    assert code == 2 and "already holds a finished run" in one_line(err)
    code, err = main(capsys, "--input", glob, "--output", out, "--strategy", "opmd", "--overwrite")
    assert code == 0 and metrics(out)["strategy"] == "opmd"
    assert math.isfinite(read_output(out)["score"].to_numpy().sum())
