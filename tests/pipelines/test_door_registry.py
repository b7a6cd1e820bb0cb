"""Issue 41 item 2: the doors are a registry (pipelines/doors/), and everything that names the
doors is read from it: --input-format's choices and help, `rescore sample --format`, the
refusals that list the staged doors, and which door a run reads through. A toy door registered
from this module (no Rescore file touched) is read end to end."""

import csv
import os
from dataclasses import fields
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data import read_output
from rescore.errors import ConfigError
from rescore.pipelines import doors
from rescore.pipelines.config import parse_args
from rescore.pipelines.options import RunConfig


def _cfg(**kw):
    base = dict(inputs=["x/*.parquet"], input_table=None, input_format="parquet")
    return SimpleNamespace(**{**base, **kw})


def test_the_builtin_doors_and_what_is_derived_from_them():
    assert [d.name for d in doors.doors()] == ["parquet", "trinity-sql", "verl-rollouts"]
    assert tuple(doors.INPUT_FORMATS) == ("parquet", "verl-rollouts")  # the SQL door is picked by --input-table
    assert doors.sample_formats() == ("parquet", "trinity-sql", "verl-rollouts")
    assert doors.input_format_help() == "parquet (default) or verl-rollouts (verl trainer.rollout_data_dir {step}.jsonl files)"
    assert [d.name for d in doors.staged_doors()] == ["trinity-sql", "verl-rollouts"]
    assert all(isinstance(d, doors.Door) for d in doors.doors())
    run_options = {f.name for f in fields(RunConfig)}
    assert {o for d in doors.doors() for o in d.owns} == {"input_table"} <= run_options
    pick = doors.door_for
    assert pick(_cfg()).name == "parquet"
    assert pick(_cfg(input_format="verl-rollouts")).name == "verl-rollouts"
    assert pick(_cfg(inputs=["sqlite:///b.db"], input_table="experience")).name == "trinity-sql"
    assert pick(_cfg(inputs=["postgresql+asyncpg://u@h/db"])).name == "trinity-sql"  # a URL without a table: its check refuses
    assert pick(_cfg(inputs=["sqlite:///b.db"], input_format="verl-rollouts")).name == "trinity-sql"
    with pytest.raises(ValueError, match="exists"):
        doors.register(doors.by_name("parquet"))
    with pytest.raises(TypeError, match="not a Door"):
        doors.register(object())


class ToyCsvDoor:
    """batch,task,run,reward lines: every row a scalar reward (as verl dumps are)."""

    name = "toy-csv"
    input_format = "toy-csv"
    what = "toy CSV files"
    chosen_by = "--input-format toy-csv"
    help = "batch,task,run,reward lines"
    sample_what = "toy CSV"
    sample_output = "a CSV file"
    owns = ()
    staged = True
    no_tokens = "toy CSV holds rewards only"

    def selects(self, cfg):
        return cfg.input_format == self.input_format

    def option_problem(self, values):
        return None

    def check(self, cfg):
        if not all(p.endswith(".csv") for p in cfg.inputs):
            raise ConfigError("--input-format toy-csv reads *.csv files")

    def read(self, cfg, directory, run):
        with open(cfg.inputs[0], newline="") as f:
            rows = [{"batch": int(b), "task": int(t), "run": int(r), "step": 0, "reward": float(w)} for b, t, r, w in csv.reader(f)]
        path = os.path.join(directory, "toy-0.parquet")
        pq.write_table(pa.Table.from_pylist(rows), path)
        return [path], {"format": self.name, "rows": len(rows)}

    def shown_inputs(self, cfg, source):
        return list(cfg.inputs)

    def write_sample(self, table, output, args):
        with open(output, "w", newline="") as f:
            csv.writer(f).writerows(zip(*(table.column(c).to_pylist() for c in ("batch", "task", "run", "reward"))))
        return f"wrote {table.num_rows} toy rows to {output}"


@pytest.fixture
def toy_door():
    door = doors.register(ToyCsvDoor())
    yield door
    doors.unregister(door.name)
    assert tuple(doors.INPUT_FORMATS) == ("parquet", "verl-rollouts")


def test_a_door_registered_from_outside_is_read_end_to_end(tmp_path, rescore, toy_door, capsys):
    from rescore.pipelines.sample import main as sample

    assert tuple(doors.INPUT_FORMATS) == ("parquet", "verl-rollouts", "toy-csv")
    assert doors.input_format_help().endswith(", verl-rollouts (verl trainer.rollout_data_dir {step}.jsonl files) or "
                                              "toy-csv (batch,task,run,reward lines)")
    data = str(tmp_path / "toy.csv")
    assert sample(["--format", "toy-csv", "--output", data, "--batches", "1", "--tasks", "2", "--runs", "3"]) == 0
    assert capsys.readouterr().err == f"wrote 6 toy rows to {data}\n"
    doc, out = rescore(data, "--input-format", "toy-csv", "--strategy", "grpo")
    assert doc["source"] == {"format": "toy-csv", "rows": 6} and doc["input"] == [data]
    assert not os.path.exists(os.path.join(out, "_source"))  # the staged unit is removed
    with open(data, newline="") as f:
        rewards = {(int(t), int(r)): float(w) for _, t, r, w in csv.reader(f)}
    scored = read_output(out).to_pylist()
    assert len(scored) == 6
    for row in scored:  # GRPO: (reward - group mean) / (unbiased std + 1e-6), the group the task's 3 runs
        group = [w for (t, _), w in rewards.items() if t == row["task"]]
        std = np.std(group, ddof=1)
        expected = 0.0 if std == 0 else (row["reward"] - np.mean(group)) / (std + 1e-6)
        assert row["score"] == pytest.approx(expected, abs=1e-5)
    # its refusals, and the ones every staged door shares, name it
    common = ["--output", str(tmp_path / "o"), "--strategy", "grpo"]
    toy = ["--input-format", "toy-csv", "--strategy", "grpo"]
    with pytest.raises(ConfigError, match=r"^--input-format toy-csv reads \*\.csv files$"):
        rescore(str(tmp_path / "toy.txt"), *toy, output=str(tmp_path / "o1"))
    with pytest.raises(ConfigError, match="need token ids; toy CSV holds rewards only$"):
        rescore(data, *toy, "--output-db", f"sqlite:///{tmp_path}/b.db", "--output-table", "t", output=str(tmp_path / "o2"))
    with pytest.raises(ConfigError, match="combine with --input-table, --input-format verl-rollouts, --input-format "
                                          "toy-csv or --output-db$"):
        rescore(data, *toy, "--incremental", output=str(tmp_path / "o3"))
    with pytest.raises(ConfigError, match="invalid choice: 'toy-tsv'"):
        parse_args(["--input", data, "--input-format", "toy-tsv", *common])


def test_the_staging_benchmark_stages_and_decodes_the_same_rows(tmp_path):
    """benchmarks/door_staging.py (docs/trainers.md's figures), on 2 dump files of 24 lines."""
    import sys

    from rescore.pipelines.sample import main as sample

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    from door_staging import measure

    dumps = str(tmp_path / "dumps")
    assert sample(["--format", "verl-rollouts", "--output", dumps, "--batches", "2", "--tasks", "3"]) == 0
    decoded = measure("decode", "verl-rollouts", dumps)
    staged = measure("stage", "verl-rollouts", dumps, str(tmp_path / "staged"))
    assert (decoded["rows"], decoded["units"]) == (staged["rows"], staged["units"]) == (48, 2)
    staged_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in (tmp_path / "staged").iterdir())
    assert staged_rows == 48 and len(os.listdir(tmp_path / "staged")) == 2
