"""verl rollout dumps (trainer.rollout_data_dir/{step}.jsonl) as input: grouped by (step, input)."""

import json
import os

import numpy as np
import pytest

from batched import run_many
from conftest import RUNNER
from data import read_output



def _dump(directory, step, entries, extra_lines=()):
    os.makedirs(directory, exist_ok=True)
    lines = [json.dumps({"input": i, "output": o, "score": s, "step": step, **extra}) for i, o, s, extra in entries]
    with open(os.path.join(directory, f"{step}.jsonl"), "w") as f:
        f.write("\n".join([*lines, *extra_lines]) + "\n")


def test_groups_by_step_and_prompt_and_scores_scalar(tmp_path, rescore):
    d = tmp_path / "rollouts"
    _dump(d, 1, [("p1", "a", 1.0, {"acc": 1}), ("p1", "b", 0.0, {"acc": 0}), ("p2", "c", 0.5, {}),
                 ("p1", "d", 1.0, {}), ("p2", "e", 0.5, {})])
    _dump(d, 2, [("p1", "f", 0.0, {"gts": [1, 2]}), ("p1", "g", 2.0, {})],
          extra_lines=["{not json", json.dumps({"input": "p3", "output": "x", "step": 2}), json.dumps({"input": "p3", "output": "x", "step": 2, "score": "high"})])
    doc, out = rescore(str(d / "*.jsonl"), "--input-format", "verl-rollouts", "--strategy", "grpo")
    assert doc["source"] == {"format": "verl-rollouts", "files": 2}
    rows = read_output(out).to_pylist()
    assert len(rows) == 7 and doc["totals"]["rows_rejected"] == 3
    by = {(r["batch"], r["input"], r["output"]): r for r in rows}
    # step 1, "p1": rewards 1, 0, 1 -> mean 2/3, unbiased std 0.57735
    mean, std = 2 / 3, np.std([1.0, 0.0, 1.0], ddof=1)
    assert by[(1, "p1", "a")]["score"] == pytest.approx((1 - mean) / (std + 1e-6), abs=1e-5)
    assert by[(1, "p1", "b")]["score"] == pytest.approx((0 - mean) / (std + 1e-6), abs=1e-5)
    assert by[(1, "p2", "c")]["score"] == 0.0  # equal rewards: exactly 0
    # step 2 is a batch of its own: "p1" there is not step 1's group
    assert by[(2, "p1", "g")]["score"] == pytest.approx(1 / (np.std([0.0, 2.0], ddof=1) + 1e-6), abs=1e-5)
    assert {r["run"] for r in rows if r["batch"] == 1 and r["input"] == "p1"} == {0, 1, 2}
    assert all(r["advantages"] == [] and r["step"] == 0 for r in rows)  # no tokens: scalar scores only
    assert by[(1, "p1", "a")]["extra"] == '{"acc": 1}' and by[(2, "p1", "f")]["gts"] == "[1, 2]"
    reasons = sorted(r["reject_reason"].split(":")[0] for r in read_output(out, "rejected").to_pylist())
    assert reasons == ["bad_json", "bad_reward", "missing_field"]


@pytest.mark.slow
def test_sample_rollouts_and_refusals(tmp_path):
    (code, _), (run, run_err), (text_only, text_only_err), (none, none_err) = run_many(tmp_path, [
        ["sample", "--format", "verl-rollouts", "--output", str(tmp_path / "r"), "--batches", "2", "--tasks", "3"],
        ["--input", str(tmp_path / "r"), "--input-format", "verl-rollouts", "--output", str(tmp_path / "o"),
         "--algorithm", "grpo", "--quiet", RUNNER],
        ["--input", str(tmp_path / "r"), "--input-format", "verl-rollouts", "--output", str(tmp_path / "o2"),
         "--strategy", "grpo", "--output-db", f"sqlite:///{tmp_path}/x.db", "--output-table", "t", RUNNER],
        ["--input", str(tmp_path / "none" / "*.jsonl"), "--input-format", "verl-rollouts", "--output",
         str(tmp_path / "o3"), "--strategy", "grpo", RUNNER],
    ])  # one child process (batched.py), each run with its own stderr
    assert code == 0 and sorted(os.listdir(tmp_path / "r")) == ["1.jsonl", "2.jsonl"]
    assert run == 0, run_err
    assert os.path.exists(tmp_path / "o" / "_SUCCESS")
    assert text_only == 2 and "verl rollout dumps hold text only" in text_only_err
    assert len(text_only_err.strip().splitlines()) == 1
    assert none == 2 and "no verl rollout files match" in none_err


# --- one line, one row: what verl writes is read as it is, a bad line is one rejected row ----------

# Every character str.splitlines breaks on besides "\n" and "\r": legal inside a JSON string that
# verl writes with ensure_ascii=False.
LINE_BREAKERS = "\u2028\u2029\u0085\x0b\x0c\x1c\x1d\x1e"


def _line(prompt, output, score=1.0, step=1, **extra):
    return json.dumps({"input": prompt, "output": output, "score": score, "step": step, **extra}, ensure_ascii=False)


def test_line_separators_inside_strings_do_not_split_lines():
    from rescore.transforms.verl_rollouts import parse_lines

    outputs = [f"a{c}b" for c in LINE_BREAKERS] + [f"x{LINE_BREAKERS}y"]
    data = "\n".join(_line(f"p{LINE_BREAKERS}", o, score=float(i)) for i, o in enumerate(outputs)) + "\n"
    rows = parse_lines("d.jsonl", data.encode("utf-8")).to_pylist()
    assert [r["output"] for r in rows] == outputs  # every response whole, none lost or split
    assert all(r["source_error"] is None and r["input"] == f"p{LINE_BREAKERS}" for r in rows)
    assert [r["run"] for r in rows] == list(range(len(outputs)))  # one prompt: one group
    assert [r["source_line"] for r in rows] == list(range(1, len(outputs) + 1))
    # Windows line ends, a blank line and a last line without its newline (complete JSON) are fine
    crlf = (_line("p", "a") + "\r\n\r\n" + _line("p", "b") + "\r\n" + _line("p", "c")).encode()
    rows = parse_lines("d.jsonl", crlf).to_pylist()
    assert [(r["output"], r["source_line"], r["source_error"]) for r in rows] == [("a", 1, None), ("b", 3, None), ("c", 4, None)]


BAD_LINES = [
    (b'{"input": "p", "output": "\\ud800", "score": 1, "step": 1}', "bad_text: line 2 holds a lone surrogate"),
    (b'{"input": "\\udfff", "output": "o", "score": 1, "step": 1}', "bad_text: line 2 holds a lone surrogate"),
    (b'{"input": "p", "output": "o", "score": 1, "step": 1, "meta": {"\\ud83d": 1}}', "bad_text:"),
    ('{"input": "p", "output": "caf\u00e9", "score": 1, "step": 1}'.encode("latin-1"), "bad_utf8: line 2 is not valid UTF-8 (byte 0xe9"),
    (b"[1, 2, 3]", "bad_json: line 2 is a JSON list, not an object"),
    (b'"just a string"', "bad_json: line 2 is a JSON str, not an object"),
    (b"{not json", "bad_json: line 2 is not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "bad_json: line 2 is nested too deeply"),
    (b'{"input": "p", "output": "o", "score": "0.5", "step": 1}', "bad_reward: line 2 score is '0.5', not a number"),
    (b'{"input": "p", "output": "o", "score": true, "step": 1}', "bad_reward: line 2 score is True"),
    (b'{"input": "p", "output": "o", "score": 1' + b"0" * 400 + b', "step": 1}', "bad_reward: line 2 score 1000"),
    (b'{"input": "p", "output": "o", "score": 1, "step": 1.5}', "bad_step: line 2 step is 1.5, not an integer"),
    (b'{"input": "p", "output": "o", "score": 1, "step": 18446744073709551616}', "bad_step: line 2 step 18446744073709551616 is beyond the int64 range"),
    (b'{"input": "p", "output": "o", "score": 1}', "missing_field: line 2 has no 'step'"),
]


@pytest.mark.parametrize("line, reason", BAD_LINES, ids=[r.split(":")[0] + str(i) for i, (_, r) in enumerate(BAD_LINES)])
def test_a_bad_line_is_one_rejected_row_with_its_reason(line, reason):
    from rescore.transforms.verl_rollouts import parse_lines

    data = (_line("p", "a", 0.0) + "\n").encode() + line + b"\n" + (_line("p", "b", 1.0) + "\n").encode()
    rows = parse_lines("d.jsonl", data).to_pylist()
    assert len(rows) == 3
    assert rows[1]["source_error"].startswith(reason), rows[1]["source_error"]
    assert rows[1]["source_line"] == 2 and rows[1]["batch"] is None
    assert [(r["output"], r["run"], r["source_error"]) for r in (rows[0], rows[2])] == [("a", 0, None), ("b", 1, None)]


def test_a_truncated_last_line_is_one_rejected_row():
    from rescore.transforms.verl_rollouts import parse_lines

    full = _line("p", "a") + "\n" + _line("p", "b")
    rows = parse_lines("d.jsonl", full[:-7].encode()).to_pylist()
    assert rows[0]["source_error"] is None and len(rows) == 2
    assert rows[1]["source_error"].startswith("truncated_line: line 2, the last, has no newline")


@pytest.mark.slow
def test_odd_lines_are_rejected_rows_and_the_run_scores_the_rest(tmp_path, rescore):
    """End to end: every line verl could write is kept whole; each bad line is one rejected row
    with its reason and the run succeeds (exit 0, _SUCCESS)."""
    d = tmp_path / "rollouts"
    d.mkdir()
    good = [_line("p\u2028", f"r{c}{i}", score=float(i % 2)) for i, c in enumerate(LINE_BREAKERS)]
    bad = [line for line, _ in BAD_LINES]
    (d / "1.jsonl").write_bytes(("\n".join(good) + "\n").encode() + b"\n".join(bad) + b"\n" + b'{"input": "p\xe2\x80')
    doc, out = rescore(str(d), "--input-format", "verl-rollouts", "--strategy", "grpo", "--max-reject-fraction", "1")
    assert os.path.exists(os.path.join(out, "_SUCCESS"))
    totals = doc["totals"]
    assert (totals["rows_read"], totals["rows_written"], totals["rows_rejected"]) == (len(good) + len(bad) + 1, len(good), len(bad) + 1)
    scored = read_output(out).to_pylist()
    assert sorted(r["output"] for r in scored) == sorted(f"r{c}{i}" for i, c in enumerate(LINE_BREAKERS))
    rewards = np.array([float(i % 2) for i in range(len(good))])
    want = {f"r{c}{i}": (rewards[i] - rewards.mean()) / (rewards.std(ddof=1) + 1e-6) for i, c in enumerate(LINE_BREAKERS)}
    for r in scored:
        assert r["score"] == pytest.approx(want[r["output"]], abs=1e-5)
    rejected = read_output(out, "rejected").to_pylist()
    assert sorted(r["source_line"] for r in rejected) == list(range(len(good) + 1, len(good) + len(bad) + 2))
    assert totals["reject_reasons"]["truncated_line"] == 1 and totals["reject_reasons"]["bad_text"] == 3
