"""Every stage of the catalog against hostile numbers and shapes (shared/hostile.md), found in the
registry, never in a hand-kept list: each strategy, shaping stage, filter and duplicate stage that
`rescore strategies` lists, and each `--algorithm` preset, runs the whole job in this process on
experience that hypothesis builds from the columns the stage needs, holding NaN, +-inf, +-1e300,
subnormals, log-probs above 0, empty and null lists, lists whose lengths disagree, groups of one
row, a batch of one row and one huge group.

The invariant: the run either exits 2 before any work with one line on stderr, or exits 0 with
metrics.json strict JSON whose numbers are all finite, every number Rescore adds to a written row
finite, and rows read = written + filtered + rejected (= the input's rows). A stage added later
is in this test without anyone adding it.

Cost: one in-process run per example; the whole catalog with one example each is `slow`, and a
subset (the first entry of each kind, in registry order, and one preset) runs in the inner loop
with two examples each. Hypothesis is derandomized and does not shrink (each step would be a
run): a failure shows the example as drawn."""

from __future__ import annotations

import json
import math
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import RUNNER
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rescore.needs import column_of
from rescore.schemas.experience import INPUT_BY_NAME, NEEDED_COLUMNS
from rescore.transforms.strategies import catalog  # noqa: F401  (registers every strategy)
from rescore.transforms.strategies import registry
from rescore.transforms.strategies.algorithms import PRESETS
from rescore.transforms.strategies.chain import chain_of

NAN, INF = math.nan, math.inf
HOSTILE = [NAN, INF, -INF, 1e300, -1e300, 5e-324, -1e-320, 1e38, 0.0, 1.0, -1.0, 0.5, 0.0]
"""Scalar values: the first ones are what hypothesis shrinks to, so even its simplest example is hostile."""
HOSTILE_LOGPROBS = [NAN, -INF, INF, 0.5, -1e300, -800.0, -5e-324, 0.0, -0.1, -1.0, -2.5]
STRING_COLUMNS = ("truncate_status", "env_state_hash")
"""Needed columns that hold text (a status, a state id); the others are numbers or lists by the
schema's rules (NEEDED_COLUMNS, *logprobs)."""
STRINGS = ["response_truncated", "buckeroo", "plumless", "", "none", "\u2028x", "s" * 300]
"""Text values: a real CRC-32 pair (buckeroo / plumless), line separators, the empty string."""
SHAPES = ["huge", "one", "singles", "mixed", "pairs"]
"""Group structures: one huge group, a batch of one row, groups of one row, mixed sizes, pairs."""
HUGE = 200


def _entries() -> list[tuple[str, list[str]]]:
    """(id, the run's strategy arguments) for every registry entry and every preset that is not
    one of them under another name (a preset of one strategy with its defaults)."""
    out = [(name, ["--strategy", name]) for name in registry.names()]
    presets = [n for n, p in sorted(PRESETS.items()) if len(p.strategies) > 1 or p.params]
    return out + [(f"algorithm:{n}", ["--algorithm", n]) for n in presets]


def _quick(entries):
    """The inner-loop subset: the first entry of each kind (registry order) and the first preset."""
    seen, out = set(), []
    for entry_id, args in entries:
        kind = "preset" if entry_id.startswith("algorithm:") else registry.spec(entry_id).kind
        if kind not in seen:
            seen.add(kind)
            out.append((entry_id, args))
    return out


ENTRIES = _entries()
QUICK = {e for e, _ in _quick(ENTRIES)}


def _needs(args: list[str]) -> list[str]:
    """The input columns the entry's chain names (its needs less the computed features)."""
    if args[0] == "--strategy":
        chain = chain_of(args[1])
    else:
        preset = PRESETS[args[1]]
        chain = chain_of(list(preset.strategies), dict(preset.params))
    names = []
    for need in chain.needs:
        name = column_of(need)  # None: a feature computed from the columns
        if name is not None and name not in INPUT_BY_NAME:
            names.append(name)
    return list(dict.fromkeys(names))


def _is_list(name: str) -> bool:
    return name.endswith(("logprobs", "logprobs_original")) or name in NEEDED_COLUMNS and name != "expert"


@st.composite
def experience(draw, needs: list[str]) -> pa.Table:
    """A table of hostile experience with the contract's columns and `needs`."""
    shape = draw(st.sampled_from(SHAPES))
    if shape == "huge":
        sizes = [HUGE]
    elif shape == "one":
        sizes = [1]
    elif shape == "singles":
        sizes = [1] * draw(st.integers(1, 4))
    elif shape == "pairs":
        sizes = [2] * draw(st.integers(1, 4))
    else:
        sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    string_tasks = draw(st.booleans())
    scalar = st.sampled_from(HOSTILE) | st.floats(-10, 10)
    logprob = st.sampled_from(HOSTILE_LOGPROBS) | st.floats(-20, 0)
    rows = []
    for g, size in enumerate(sizes):
        batch = g % 2
        task = STRINGS[g % 3 + 1] + str(g // 3) if string_tasks else [2**31, 2**53 + 1, -7, 0][g % 4] + g
        equal = draw(st.booleans())  # all equal rewards in the group (exactly-equal floats)
        first = draw(scalar)
        for r in range(size):
            length = draw(st.sampled_from([2, 0, 1, 3])) if size < HUGE else 2
            prompt = 1
            row = {
                "batch": batch, "task": task, "run": r, "step": r % 2 if shape == "mixed" else 0,
                "reward": first if equal else draw(scalar),
                "tokens": list(range(prompt + length)), "prompt_length": prompt,
                "action_mask": [1] * length,
                "logprobs": [draw(logprob) for _ in range(length)],
            }
            if size < HUGE and draw(st.integers(0, 9)) == 0:  # a list of another length, or null
                row[draw(st.sampled_from(["logprobs", "action_mask"]))] = draw(st.sampled_from([None, [0], [-0.5] * (length + 2)]))
            for name in needs:
                if name in STRING_COLUMNS:
                    row[name] = draw(st.sampled_from([*STRINGS, None]))
                elif name == "expert":
                    row[name] = draw(st.sampled_from([False, True, None]))
                elif _is_list(name):
                    values = logprob if name.endswith(("logprobs", "logprobs_original")) else scalar
                    n = length if size == HUGE or draw(st.integers(0, 9)) else length + 1
                    row[name] = draw(st.sampled_from([None, []])) if size < HUGE and not draw(st.integers(0, 9)) else [draw(values) for _ in range(n)]
                else:
                    row[name] = draw(st.sampled_from([None, *HOSTILE]) | st.floats(-10, 10)) if size < HUGE else draw(scalar)
            rows.append(row)
    schema = pa.schema(
        [("batch", pa.int64()), ("task", pa.string() if string_tasks else pa.int64()), ("run", pa.int64()),
         ("step", pa.int64()), ("reward", pa.float64()), ("tokens", pa.list_(pa.int64())), ("prompt_length", pa.int64()),
         ("action_mask", pa.list_(pa.int8())), ("logprobs", pa.list_(pa.float32()))]
        + [(n, pa.string() if n in STRING_COLUMNS else pa.bool_() if n == "expert" else pa.list_(pa.float64()) if _is_list(n) else pa.float64())
           for n in needs]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def _strict(text: str):
    """metrics.json parsed as strict JSON: NaN, Infinity and -Infinity are errors."""
    def refuse(constant):
        raise ValueError(f"metrics.json holds {constant}")
    return json.loads(text, parse_constant=refuse)


def _numbers(value, path=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, f"{path}/{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _numbers(v, f"{path}/{i}")
    elif isinstance(value, float):
        yield path, value


def _added_columns_finite(out: str, input_names: list[str]) -> None:
    """Every number Rescore adds to a scored row (score, advantages, returns, is_weights, a
    shaped reward, ...) is finite."""
    for name in sorted(os.listdir(out)):
        if not name.startswith("scored") or not name.endswith(".parquet"):
            continue
        table = pq.read_table(os.path.join(out, name))
        for column in table.column_names:
            if column in input_names and column != "reward":
                continue
            col = table[column]
            values = col.combine_chunks().flatten() if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) else col
            if pa.types.is_floating(values.type):
                bad = [v for v in values.to_pylist() if v is not None and not math.isfinite(v)]
                assert not bad, f"{name}: column {column!r} holds {bad[:3]}"


def check_run(tmp_path, capsys, args: list[str], table: pa.Table) -> int:
    """One in-process run of the job on `table`, checked against the invariant; its exit status."""
    from rescore.pipelines.cli import main

    work = tmp_path / "run"
    shutil.rmtree(work, ignore_errors=True)
    (work / "in").mkdir(parents=True)
    pq.write_table(table, str(work / "in" / "part-0.parquet"))
    out = str(work / "out")
    capsys.readouterr()
    code = main(["--input", str(work / "in" / "*.parquet"), "--output", out, RUNNER, "--quiet", "--max-reject-fraction", "1", *args])
    err = capsys.readouterr().err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err
        assert not os.path.exists(out) or not os.listdir(out), f"exit 2 after work: {os.listdir(out)}"
        return code
    assert code == 0, err
    with open(os.path.join(out, "metrics.json"), encoding="utf-8") as f:
        doc = _strict(f.read())
    bad = [(p, v) for p, v in _numbers(doc) if not math.isfinite(v)]
    assert not bad, bad
    totals = doc["totals"]
    assert totals["rows_read"] == table.num_rows
    assert totals["rows_read"] == totals["rows_written_original"] + totals["rows_filtered"] + totals["rows_rejected"]
    assert os.path.exists(os.path.join(out, "_SUCCESS"))
    _added_columns_finite(out, table.column_names)
    return code


def _property(entry_id: str, args: list[str], examples: int):
    needs = _needs(args)
    codes = []

    # no shrinking: each step would be a whole run; the failing example is reported as drawn
    @settings(max_examples=examples, derandomize=True, deadline=None, database=None, phases=(Phase.explicit, Phase.generate),
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(table=experience(needs))
    def prop(tmp_path, capsys, table):
        codes.append(check_run(tmp_path, capsys, args, table))

    return prop, codes


@pytest.mark.parametrize(
    "entry", [pytest.param(e, id=e[0], marks=() if e[0] in QUICK else pytest.mark.slow) for e in ENTRIES]
)
def test_every_stage_survives_hostile_experience(entry, tmp_path, capsys):
    entry_id, args = entry
    prop, codes = _property(entry_id, args, 2 if entry_id in QUICK else 1)
    prop(tmp_path, capsys)
    assert codes, "no example ran"


def test_the_catalog_is_read_from_the_registry():
    """Every strategy `rescore strategies` lists is an entry here (and the quick subset has one
    entry of each kind), so a stage added later is covered without anyone adding it."""
    from rescore.pipelines.listings import strategies

    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert strategies([]) == 0
    listed = {line.split()[0] for line in buf.getvalue().splitlines() if line.startswith("  ")}
    assert listed == {e for e, _ in ENTRIES if not e.startswith("algorithm:")}
    assert {registry.spec(e).kind for e in QUICK if not e.startswith("algorithm:")} == {*registry.KINDS, registry.SHAPE}


@st.composite
def rewards_table(draw) -> pa.Table:
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    rows = [{"batch": g % 2, "task": ["buckeroo", "plumless", "q"][g % 3], "run": r, "step": 0,
             "reward": draw(st.sampled_from(HOSTILE) | st.floats(-10, 10))} for g, size in enumerate(sizes) for r in range(size)]
    return pa.Table.from_pylist(rows)


@settings(max_examples=3, derandomize=True, deadline=None, database=None, phases=(Phase.explicit, Phase.generate),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(table=rewards_table())
def test_task_stats_of_hostile_rewards_publishes_only_finite_numbers(tmp_path, capsys, table):
    """`rescore task-stats` on the same hostile rewards: exit 0, every number it writes finite
    (or null), task_stats.json strict JSON; the rows it leaves out are the non-finite ones."""
    from rescore.pipelines.cli import main

    work = tmp_path / "stats-run"
    shutil.rmtree(work, ignore_errors=True)
    (work / "in").mkdir(parents=True)
    pq.write_table(table, str(work / "in" / "part-0.parquet"))
    capsys.readouterr()
    code = main(["task-stats", "--input", str(work / "in"), "--output", str(work / "out"), RUNNER])
    assert code == 0, capsys.readouterr().err
    for name in ("task_stats.parquet", "task_batch_stats.parquet"):
        for column in (t := pq.read_table(str(work / "out" / name))).column_names:
            if pa.types.is_floating(t[column].type):
                bad = [v for v in t[column].to_pylist() if v is not None and not math.isfinite(v)]
                assert not bad, f"{name}: {column} holds {bad}"
    with open(work / "out" / "task_stats.json", encoding="utf-8") as f:
        doc = _strict(f.read())
    assert all(math.isfinite(v) for _, v in _numbers(doc))
    finite = sum(1 for v in table["reward"].to_pylist() if math.isfinite(v))
    assert sum(pq.read_table(str(work / "out" / "task_stats.parquet"))["rows"].to_pylist()) == finite
