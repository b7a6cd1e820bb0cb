"""Issue 41 item 2: the doors are a registry (pipelines/doors/), and everything that names the
doors is read from it: --input-format's choices and help, `rescore sample --format`, the
refusals that list the staged doors, which door a run reads through, and the doors' own options
(declared on the door, collected into the parser, --help, the --config keys and RunConfig). A toy
door registered from this module (no Rescore file touched), with an option of its own, is read
end to end."""

import csv
import os
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data import read_output
from rescore.errors import ConfigError
from rescore.pipelines import cli, doors, options
from rescore.pipelines.config import parse_args
from rescore.transforms.settings import option


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
    # the doors' own options: declared on the door, listed just before --input-format
    assert [(f.name, doors.declared_in(f).__name__) for f in doors.option_fields()] == [("input_table", "TrinitySqlOptions")]
    assert [f.name for f in options.table()].index("input_table") + 1 == [f.name for f in options.table()].index("input_format")
    assert list(options.config_keys()).index("input_table") + 1 == list(options.config_keys()).index("input_format")
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


def _scale(flag, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < float("inf"):
        return f"{flag} must be a number > 0, got {value!r}"
    return None


@dataclass(frozen=True, kw_only=True)
class ToyOptions:
    toy_reward_scale: float = option(1.0, metavar="X", check=_scale, help="toy-csv: read each reward times X")


class ToyCsvDoor:
    """batch,task,run,reward lines: every row a scalar reward (as verl dumps are), times
    --toy-reward-scale (its own option)."""

    name = "toy-csv"
    input_format = "toy-csv"
    what = "toy CSV files"
    chosen_by = "--input-format toy-csv"
    help = "batch,task,run,reward lines"
    sample_what = "toy CSV"
    sample_output = "a CSV file"
    options = ToyOptions
    staged = True
    no_tokens = "toy CSV holds rewards only"

    def selects(self, cfg):
        return cfg.input_format == self.input_format

    def option_problem(self, values):
        if values["toy_reward_scale"] != 1.0 and values["input_format"] != self.input_format:
            return "--toy-reward-scale reads toy CSV: pass --input-format toy-csv"
        return None

    def check(self, cfg):
        if not all(p.endswith(".csv") for p in cfg.inputs):
            raise ConfigError("--input-format toy-csv reads *.csv files")

    def read(self, cfg, directory, run):
        with open(cfg.inputs[0], newline="") as f:
            rows = [{"batch": int(b), "task": int(t), "run": int(r), "step": 0, "reward": float(w) * cfg.toy_reward_scale}
                    for b, t, r, w in csv.reader(f)]
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
    assert sample(["--format", "toy-csv", "--output", data, "--batches", "1", "--tasks", "2", "--runs", "3",
                   "--seed", "3"]) == 0  # seed 3: rewards that differ within each task
    assert capsys.readouterr().err == f"wrote 6 toy rows to {data}\n"
    doc, out = rescore(data, "--input-format", "toy-csv", "--strategy", "grpo", "--toy-reward-scale", "2.5")
    assert doc["source"] == {"format": "toy-csv", "rows": 6} and doc["input"] == [data]
    assert not os.path.exists(os.path.join(out, "_source"))  # the staged unit is removed
    with open(data, newline="") as f:
        rewards = {(int(t), int(r)): 2.5 * float(w) for _, t, r, w in csv.reader(f)}
    scored = read_output(out).to_pylist()
    assert len(scored) == 6 and len(set(rewards.values())) > 1
    for row in scored:  # GRPO: (reward - group mean) / (unbiased std + 1e-6), the group the task's 3 runs
        assert row["reward"] == rewards[row["task"], row["run"]]  # read through the door's option
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


def test_a_door_declares_its_own_options(tmp_path, toy_door, capsys):
    """The toy door's --toy-reward-scale, declared on ToyOptions only: a flag, a --config key,
    --help's line before --input-format, an attribute of the run; refused in one line when bad."""
    data, out = str(tmp_path / "toy.csv"), str(tmp_path / "o")
    toy = ["--input", data, "--output", out, "--strategy", "grpo", "--input-format", "toy-csv"]
    assert (parse_args(toy).toy_reward_scale, parse_args([*toy, "--toy_reward_scale=3"]).toy_reward_scale) == (1.0, 3.0)
    config = tmp_path / "run.yaml"
    config.write_text("toy_reward_scale: 0.5\ninput_format: toy-csv\n")
    cfg = parse_args(["--config", str(config), *toy])
    assert (cfg.toy_reward_scale, cfg.door_options) == (0.5, {"input_table": None, "toy_reward_scale": 0.5})
    assert parse_args(["--config", str(config), *toy, "--toy-reward-scale", "4"]).toy_reward_scale == 4.0  # flag over YAML
    help_text = " ".join(options.parser().format_help().split())
    assert "--toy-reward-scale X toy-csv: read each reward times X --input-format {parquet,verl-rollouts,toy-csv}" in help_text
    assert list(options.config_keys())[8:11] == ["input_table", "toy_reward_scale", "input_format"]
    # refused: exit 2 and one line, before any work (nothing is written to --output)
    bad = [([*toy, "--toy-reward-scale", "-1"], "--toy-reward-scale must be a number > 0, got -1.0"),
           ([*toy, "--toy-reward-scale", "1e400"], "--toy-reward-scale must be a number > 0, got inf"),
           ([*toy, "--toy-reward-scale=nan"], "--toy-reward-scale must be a number > 0, got nan"),
           ([*toy, "--toy-reward-scale", "x"], "argument --toy-reward-scale/--toy_reward_scale: invalid float value: 'x'"),
           ([*toy, "--toy-reward-scal", "2"], "unknown option --toy-reward-scal (did you mean --toy-reward-scale?): "
                                              "not a Rescore flag nor a Beam pipeline option"),
           ([*toy[:-2], "--toy-reward-scale", "2"], "--toy-reward-scale reads toy CSV: pass --input-format toy-csv")]
    config.write_text("toy_reward_scale: [2]\n")
    bad.append((["--config", str(config), *toy], f"config {config}: 'toy_reward_scale' must be a number, got [2] (a list)"))
    for argv, line in bad:
        assert cli.main(argv) == 2, argv
        assert capsys.readouterr().err == f"rescore: error: {line}\n"
    assert not os.path.exists(out)


def test_an_option_name_two_doors_share_is_refused_where_the_door_registers(toy_door):
    """A door's option may not take a field name, flag, dest, --config key or environment
    variable of another door's option or of a run option: ValueError when it registers."""

    @dataclass(frozen=True, kw_only=True)
    class Clash:
        input_table: str | None = option(None, help="x")  # the SQL door's

    @dataclass(frozen=True, kw_only=True)
    class FlagClash:
        table_name: str | None = option(None, flags=("--toy-reward-scale",), help="x")  # the toy door's flag

    @dataclass(frozen=True, kw_only=True)
    class RunClash:
        toy_out: str | None = option(None, yaml="output", help="x")  # a run option's --config key

    @dataclass(frozen=True, kw_only=True)
    class EnvClash:
        toy_seconds: float = option(1.0, env="RESCORE_PROGRESS_SECONDS", help="x")

    @dataclass(frozen=True, kw_only=True)
    class NoDefault:
        toy_path: str = option(help="x")

    @dataclass(kw_only=True)
    class NotFrozen:
        toy_path: str = option("", help="x")

    def door(opts, name="toy-two"):
        d = ToyCsvDoor()
        d.name, d.input_format, d.options = name, name, opts
        return d

    before = doors.doors()
    for opts, message in [
        (Clash, "door 'toy-two': its option 'input_table' takes the option 'input_table', which the door 'trinity-sql' has already"),
        (FlagClash, "door 'toy-two': its option 'table_name' takes the flag '--toy-reward-scale', which the door 'toy-csv' has already"),
        (RunClash, "door 'toy-two': its option 'toy_out' takes the --config key 'output', which the run option 'output' "
                   "(pipelines/options.py) has already"),
        (EnvClash, "takes the environment variable 'RESCORE_PROGRESS_SECONDS', which the run option 'progress_seconds'"),
        (NoDefault, "door 'toy-two': its options: the option 'toy_path' needs a default"),
        (NotFrozen, "door 'toy-two': its options must be a @dataclass(frozen=True) class of option() fields"),
    ]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            doors.register(door(opts))
    assert doors.doors() == before


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
