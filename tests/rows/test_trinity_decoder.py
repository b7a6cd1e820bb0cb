"""The decoders of untrusted input, attacked: Trinity's TRXP blobs (with the SQL row around
them) and verl's JSONL lines. Whatever the bytes, the answer is a decoded row or a rejected row
with a reason: never an exception, never code run, nothing allocated on a header's say.

Hand-made lies first (trinity_hostile.py), then hypothesis over random bytes and over valid
inputs mutated (bytes flipped, inserted, deleted; header numbers changed). "Never code run" is
watched with an audit hook (PEP 578): no exec/compile/eval, no process, no pickle global
outside the decoder's allow-list while a decoder runs."""

import json
import struct
import sys

import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trinity_hostile as hostile
from rescore.transforms import sql_database, verl_rollouts
from rescore.transforms.rows import trinity_rows
from rescore.transforms.rows import trinity_format as trxp

META = {"id": 7, "task_id": "t", "run_id": 0, "msg_id": "m", "model_version": 0, "reward": 1.0}

# --- never code run: an audit hook that records what a decoder asks of the interpreter --------

_FORBIDDEN = ("exec", "compile", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "subprocess.Popen",
              "ctypes.", "socket.", "builtins.input", "os.fork", "marshal.loads", "os.remove", "os.rename")
_EVENTS: list | None = None


def _hook(event, args):
    if _EVENTS is not None and (event.startswith(_FORBIDDEN) or event == "pickle.find_class"):
        _EVENTS.append((event, args[:2] if event == "pickle.find_class" else ()))


sys.addaudithook(_hook)


class _Watch:
    """Records forbidden audit events (and every pickle global looked up) inside the block."""

    def __enter__(self):
        global _EVENTS
        _EVENTS = []
        return self

    def __exit__(self, *exc):
        global _EVENTS
        self.events, _EVENTS = _EVENTS, None
        bad = [e for e in self.events if e[0] != "pickle.find_class" or tuple(e[1]) not in trxp._ALLOWED_GLOBALS]
        assert not bad, f"a decoder asked for {bad[:3]}"


def _fits_staged_schema(row):
    pa.Table.from_pylist([row], schema=trinity_rows.STAGED_SCHEMA)  # raises if any value does not fit


def _row(meta, blob):
    with _Watch():
        row = trinity_rows.row_columns(meta, blob)
    _fits_staged_schema(row)
    return row


# --- lies, one at a time ------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(hostile.HOSTILE))
def test_a_lying_blob_is_one_rejected_row_with_its_reason(name):
    blob, reason = hostile.HOSTILE[name]
    with _Watch():
        try:
            trxp.decode(blob)
        except trxp.BlobError:
            pass  # a BlobError or a decoded blob the row check refuses: both fine, nothing else
    row = _row(META, blob)
    assert row["source_error"].startswith(reason), row["source_error"]
    assert row["sql_id"] == 7 and row["batch"] is None and row["tokens"] is None


def test_the_hostile_blobs_differ_from_a_valid_one_only_by_their_lie():
    row = _row(META, hostile.valid_blob())
    assert row["source_error"] is None and row["tokens"] == [0, 1, 2, 3, 4] and row["prompt_length"] == 2
    ((item, tensors),) = trxp.decode(hostile.with_header(hostile.tokens_header(), struct.pack("<5i", 1, 2, 3, 4, 5)))
    assert tensors["tokens"].tolist() == [1, 2, 3, 4, 5]  # the header builder makes valid blobs when it tells the truth
    assert trxp.loads_plain(hostile.deep_info_pickle(3))["items"][0]["info"] == {"a": {"a": {"a": {}}}}
    ((item, _),) = trxp.decode(hostile.shared_list_bomb(3))  # small: fine, and shaped as the big one
    assert item["info"] == [[[[], []], [[], []]], [[[], []], [[], []]]]


@pytest.mark.parametrize("column, value, reason", [
    ("reward", "n/a", "bad_reward: reward is 'n/a', not a number"),
    ("reward", b"\x00", "bad_reward: reward is b'\\x00', not a number"),
    ("reward", 10**400, "bad_reward: reward 1000"),
    ("run_id", "two", "bad_run: run_id is 'two', not an integer"),
    ("run_id", 1.5, "bad_run: run_id is 1.5, not an integer"),
    ("run_id", 2**64, "bad_run: run_id 18446744073709551616 is beyond the int64 range"),
    ("model_version", "v2", "bad_model_version: model_version is 'v2', not an integer"),
    ("task_id", b"\xff\xfe", "bad_task: task_id is b'\\xff\\xfe', not text"),
    ("task_id", 2.5, "bad_task: task_id is 2.5, not text"),
    ("msg_id", b"\xff", "bad_msg_id: msg_id is b'\\xff', not text"),
])
def test_text_in_numeric_columns_is_one_rejected_row(column, value, reason):
    row = _row({**META, column: value}, hostile.valid_blob())
    assert row["source_error"].startswith(reason), row["source_error"]
    assert row["sql_id"] == 7 and row["trinity_blob"] is not None


@pytest.mark.parametrize("blob", ["TRXP text", 10**9, 1.5])
def test_a_blob_column_holding_text_or_a_number_is_one_rejected_row(blob):
    row = _row(META, blob)  # 10**9: bytes(10**9) would allocate a gigabyte
    assert row["source_error"] == f"bad_blob: experience_bytes holds {type(blob).__name__}, not bytes"


# --- fuzzing: random and mutated blobs ---------------------------------------------------------

VALID = hostile.valid_blob()


def _check_blob(blob):
    with _Watch():
        try:
            items = trxp.decode(blob)
        except trxp.BlobError as e:
            assert str(e).split(":", 1)[0] in ("bad_blob", "unsafe_pickle"), str(e)
        else:
            assert all(isinstance(i, dict) and all(isinstance(t, torch.Tensor) for t in f.values()) for i, f in items)
    row = _row(META, blob)
    if row["source_error"] is None:  # decoded: a row the validation step can judge (it checks prompt_length)
        assert isinstance(row["tokens"], list) and isinstance(row["prompt_length"], int) and isinstance(row["batch"], int)


_FUZZ = settings(max_examples=300, deadline=2000, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(st.binary(max_size=400))
def test_fuzz_random_bytes(data):
    _check_blob(data)
    _check_blob(b"TRXP\x01" + data)


@st.composite
def mutated(draw, base: bytes):
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif data:
            del data[at : at + draw(st.integers(1, 8))]
    return bytes(data)


@_FUZZ
@given(mutated(VALID))
def test_fuzz_mutated_valid_blob(blob):
    _check_blob(blob)


_NUMBERS = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([0, -1, 2**63, 2**64 - 1, 2**31]),
                     st.floats(allow_nan=True), st.text(max_size=3), st.none(), st.booleans())


@pytest.mark.slow
@_FUZZ
@given(st.fixed_dictionaries({}, optional={
    "dtype": st.sampled_from([*trxp._ST_DTYPES, "I128", "", "f32"]),
    "shape": st.lists(_NUMBERS, max_size=4) | _NUMBERS,
    "data_offsets": st.lists(_NUMBERS, max_size=3) | _NUMBERS,
}), st.integers(0, 64), st.one_of(st.none(), st.integers(0, 2**64 - 1)))
def test_fuzz_header_numbers(spec, body, declared):
    header = {"0:tokens": {"dtype": "I32", "shape": [5], "data_offsets": [0, 20]} | spec}
    _check_blob(hostile.with_header(header, bytes(range(body)), declared=declared))


@_FUZZ
@given(st.sampled_from(["reward", "run_id", "task_id", "msg_id", "model_version", "id"]),
       st.one_of(_NUMBERS, st.binary(max_size=4), st.text(max_size=4)))
def test_fuzz_meta_columns(column, value):
    row = _row({**META, column: value}, VALID)
    assert (row["source_error"] is None) == (row["sql_id"] is not None and row["tokens"] is not None)


# --- fuzzing: verl JSONL lines -----------------------------------------------------------------

VALID_LINE = json.dumps({"input": "p\u2028", "output": "o\u0085", "score": 0.5, "step": 3, "acc": [1]}, ensure_ascii=False).encode()


def _check_lines(data: bytes):
    with _Watch():
        table = verl_rollouts.parse_lines("f.jsonl", data)
    rows = table.to_pylist()
    lines = [line.removesuffix(b"\r") for line in data.split(b"\n")]
    if lines and lines[-1] == b"":
        lines.pop()
    assert [r["source_line"] for r in rows] == [i for i, line in enumerate(lines, 1) if line.strip(b" \t\r")]
    for r in rows:
        if r["source_error"] is None:
            assert isinstance(r["batch"], int) and isinstance(r["reward"], float) and r["run"] >= 0
        else:
            assert r["source_error"].split(":", 1)[0] in (
                "bad_json", "bad_utf8", "truncated_line", "missing_field", "bad_reward", "bad_step", "bad_text"), r["source_error"]
            assert r["batch"] is None


@_FUZZ
@given(st.binary(max_size=300))
def test_fuzz_random_jsonl(data):
    _check_lines(data)


@pytest.mark.slow
@_FUZZ
@given(st.lists(mutated(VALID_LINE), min_size=1, max_size=4), st.booleans())
def test_fuzz_mutated_jsonl(lines, newline_at_end):
    _check_lines(b"\n".join(lines) + (b"\n" if newline_at_end else b""))


@pytest.mark.slow
@_FUZZ
@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                    max_leaves=8),
       st.sampled_from(["input", "output", "score", "step", "gts", "other"]))
def test_fuzz_jsonl_field_values(value, field):
    entry = {"input": "p", "output": "o", "score": 1.0, "step": 1, field: value}
    _check_lines(json.dumps(entry, ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n")


def test_no_decoder_can_run_code():
    """Statically: the decoders of untrusted input call no eval/exec/compile, no marshal or
    yaml, and unpickle only through the restricted unpickler (pickle.loads/load never)."""
    import ast
    import inspect

    banned = {"eval", "exec", "compile", "__import__", "loads", "load", "Unpickler", "literal_eval"}
    for module in (trxp, verl_rollouts, trinity_rows, sql_database):
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
                restricted = (name == "load" and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call)
                              and getattr(f.value.func, "id", None) == "_PlainUnpickler")
                json_text = owner == "json" and name == "loads"
                assert name not in banned or restricted or json_text, f"{module.__name__}: {ast.unparse(node)}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                assert not {"marshal", "yaml", "dill", "cloudpickle", "shelve"} & set(names), ast.unparse(node)
    assert issubclass(trxp._PlainUnpickler, __import__("pickle").Unpickler)
