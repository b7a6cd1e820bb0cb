"""Run options are declared once (transforms/settings.py StepSettings, pipelines/options.py
RunConfig, transforms/rows/model_columns.py ModelOptions, all with `option()`): the parser, --help, the --config keys and their checks, the settings the steps take
and early.py's plain-run flags all come from the declarations, and nothing else declares one."""

import ast
import dataclasses
import json
import os
import pickle
import subprocess
import sys
from dataclasses import fields

import pytest

from rescore.errors import ConfigError
from rescore.pipelines import early, options
from rescore.pipelines.config import parse_args
from rescore.pipelines.model_flags import MODEL_FLAGS, YAML_KEYS
from rescore.pipelines.options import RunConfig, check_config, parser, table
from rescore.transforms.rows.model_columns import ModelOptions
from rescore.transforms.settings import StepSettings, flags_of, spec, step_settings, value_type, yaml_key

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_GROUP = "model stage"
DECLARED_IN = {os.path.join("pipelines", "options.py"), os.path.join("transforms", "settings.py")}


def _run(*argv, tmp_path):
    (tmp_path / "in.parquet").touch()
    return parse_args(["--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out"), "--strategy", "grpo", *argv])


def test_the_parser_is_the_table():
    """Every declared flag is in the parser under its dest, and every flag of the parser outside
    the model stage's group is a declared one: the parser declares nothing itself."""
    p = parser()
    declared = {flag: f for f in table() for flag in flags_of(f)}
    actions = {o: a for a in p._actions for o in a.option_strings}
    for flag, f in declared.items():
        assert flag in actions, flag
        assert actions[flag].dest == options.dest(f)
        assert actions[flag].help == options._help(f)
    model = {o for g in p._action_groups if g.title and g.title.startswith(MODEL_GROUP) for a in g._group_actions
             for o in a.option_strings}
    assert set(actions) - {"-h", "--help"} - model == set(declared)
    # the model stage's group is its table: one flag per ModelOptions field, declared with option()
    # like every other run option (dest, help, choices, type from the declaration)
    assert all(spec(f) is not None for f in fields(ModelOptions))
    assert model == {flag for f in MODEL_FLAGS for flag in flags_of(f)}
    assert [f.name for f in MODEL_FLAGS] == list(YAML_KEYS) and set(YAML_KEYS) == {f.name for f in fields(ModelOptions)}
    assert (YAML_KEYS["batch_size"], YAML_KEYS["entropy"], YAML_KEYS["reward_fn_timeout"]) == (int, bool, float)
    for f in MODEL_FLAGS:
        assert actions[flags_of(f)[0]].dest == options.dest(f) and actions[flags_of(f)[0]].help == spec(f).help
    assert [actions[flag].dest for flag in ("--model-dtype", "--model_dtype", "--model-accelerator", "--accelerator")] == [
        "model_dtype", "model_dtype", "model_accelerator", "accelerator"]
    assert list(actions["--model-dtype"].choices) == ["auto", "float32", "bfloat16", "float16"]
    assert (actions["--model-batch-size"].type, actions["--reward-fn-timeout"].type.__name__) == (int, "seconds_arg")
    assert actions["--entropy"].nargs == 0 and actions["--entropy"].default is None
    # --help's groups: the common options, then HELP_GROUPS' headings, each option in one of them
    # (none is left for the catch-all group while the headings cover every declared option)
    titled = {g.title: {o for a in g._group_actions for o in a.option_strings} for g in p._action_groups if g._group_actions}
    assert list(titled)[0] == "common options"
    assert options.OTHER_GROUP not in titled
    # (the doors' options, pipelines/doors/, where HELP_GROUPS says DOOR_OPTIONS)
    grouped = {name for _, names in options.help_groups() for name in names} | set(options.COMMON_OPTIONS)
    assert grouped == {f.name for f in table() if flags_of(f)} and options.DOOR_OPTIONS not in grouped
    assert "input_table" in dict(options.help_groups())["other inputs and outputs"]
    for title, names in options.help_groups():
        assert titled[title] == {flag for f in table() if f.name in names for flag in flags_of(f)}, title


def test_the_yaml_keys_and_their_types_are_the_table():
    keys = options.config_keys()
    assert list(keys) == [yaml_key(f) for f in table() if yaml_key(f)]
    assert {"input", "output", "strategy", "params", "pipeline_options", "models", "buckets", "unit_cache_mb",
            "read_ahead_mb", "progress_seconds", "wait_for_lock"} <= set(keys)
    assert not {"quiet", "log_level", "run_name", "config", "group_filter"} & set(keys)  # command line only
    wrong = {bool: ("true or false", "yes"), int: ("an integer", 1.5), float: ("a number", "x"), str: ("a string", 3)}
    checked = 0
    for f in table():
        kind = value_type(options.declared_in(f), f)
        if yaml_key(f) and kind in wrong and spec(f).yaml_check is None:
            what, value = wrong[kind]
            with pytest.raises(ConfigError, match=rf"^config c.yaml: '{yaml_key(f)}' must be {what}, got {value!r}"):
                check_config("c.yaml", {yaml_key(f): value})
            checked += 1
    assert checked >= 20
    with pytest.raises(ConfigError, match=r"unknown key 'bukets'; valid keys: input, output, "):
        check_config("c.yaml", {"bukets": 3})


def test_the_steps_get_one_frozen_picklable_settings_object(tmp_path):
    cfg = _run("--device", "cpu", "--io-threads", "2", "--keep-filtered", "--unit-cache-mb", "64", tmp_path=tmp_path)
    settings = step_settings(cfg)
    assert type(settings) is StepSettings and isinstance(cfg, StepSettings)
    assert (settings.device, settings.io_threads, settings.keep_filtered, settings.unit_cache_mb) == ("cpu", 2, True, 64.0)
    assert pickle.loads(pickle.dumps(settings)) == settings
    assert all(isinstance(getattr(settings, f.name), (bool, int, float, str, type(None))) for f in fields(settings))
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.device = "cuda"
    assert all(spec(f) is not None for f in fields(StepSettings))  # every step setting is a declared option
    # the run itself too: a door's option (cfg.input_table, RunConfig.door_options) survives the trip
    assert pickle.loads(pickle.dumps(cfg)) == cfg and pickle.loads(pickle.dumps(cfg)).input_table is None


def test_early_prefetches_only_with_the_options_declared_plain():
    base = ["--input", "a", "--output", "b"]
    args = early.plain_run([*base, "--unit-cache-mb", "0", "--progress-seconds=2", "--io_threads", "3"])
    assert (args.input, args.output, args.unit_cache_mb, args.progress_seconds, args.io_threads) == (["a"], "b", 0.0, 2.0, 3)
    for other in (["--accelerator", "x"], ["--config", "c.yaml"], ["--incremental"], ["--runner", "FlinkRunner"]):
        assert early.plain_run([*base, *other]) is None, other
    for f in table():  # every option declared plain may be given, and nothing else
        if flags_of(f) and spec(f).plain:
            value = [] if value_type(options.declared_in(f), f) is bool else [str((spec(f).choices or ["1"])[0])]
            assert early.plain_run([*base, flags_of(f)[0], *value]) is not None, f.name
        elif flags_of(f):
            value = [] if value_type(options.declared_in(f), f) is bool else ["1"]
            assert early.plain_run([*base, flags_of(f)[0], *value]) is None, f.name


def test_the_table_is_read_before_beam_torch_and_the_strategies_import():
    """early.py reads the table and parses a run before the `rescore` command imports Beam and
    torch: neither imports them, nor the strategy catalog (--strategy's help lists it only when asked)."""
    probe = ("import json, sys\nimport rescore.pipelines.early as early\n"
             "assert early.plain_run(['--input', 'a', '--output', 'b', '--strategy', 'grpo', '--memory-mb', '900'])\n"
             "print(json.dumps([m for m in ('apache_beam', 'torch', 'yaml', 'rescore.transforms.strategies.catalog')"
             " if m in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout) == [], proc.stderr


def _declares(path: str, flags: set[str]) -> list[str]:
    """The add_argument calls in `path` that declare one of `flags`, unless the module is another
    command's (`prog="rescore sample"`: its --output is its own)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    progs = [k.value.value for node in ast.walk(tree) if isinstance(node, ast.Call) for k in node.keywords
             if k.arg == "prog" and isinstance(k.value, ast.Constant)]
    if any(str(prog).startswith("rescore ") for prog in progs):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            names = {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
            found += sorted(names & flags)
    return found


def test_nothing_else_declares_a_run_option():
    """No other module adds a run option's flag (or a model stage's) to the run's parser, and the environment
    variables that set an option's default are read only in pipelines/options.py."""
    flags = {flag for f in [*table(), *MODEL_FLAGS] for flag in flags_of(f)}
    envs = {spec(f).env for f in table() if spec(f).env}
    assert envs == {"RESCORE_UNIT_CACHE_MB", "RESCORE_READ_AHEAD_MB", "RESCORE_MEMORY_MB", "RESCORE_PROGRESS_SECONDS"}
    allowed: set[str] = set()  # the unit store takes the cache sizes from the run's settings
    for folder in ("pipelines", "transforms", "schemas", "rescore"):
        for base, _, names in os.walk(os.path.join(ROOT, folder)):
            for name in names:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(base, name)
                rel = os.path.relpath(path, ROOT)
                if rel in DECLARED_IN:
                    continue
                assert _declares(path, flags) == [], rel
                if rel not in allowed:
                    text = open(path, encoding="utf-8").read()
                    assert not [e for e in envs if e in text], rel


def test_the_new_options_flag_yaml_environment_and_default(tmp_path, monkeypatch):
    for name in ("RESCORE_UNIT_CACHE_MB", "RESCORE_READ_AHEAD_MB", "RESCORE_PROGRESS_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    cfg = _run(tmp_path=tmp_path)
    assert (cfg.unit_cache_mb, cfg.read_ahead_mb, cfg.progress_seconds) == (None, None, 15.0)
    monkeypatch.setenv("RESCORE_UNIT_CACHE_MB", "12")
    monkeypatch.setenv("RESCORE_PROGRESS_SECONDS", "0.2")
    cfg = _run(tmp_path=tmp_path)
    assert (cfg.unit_cache_mb, cfg.progress_seconds) == (12.0, 0.2)
    cfg = _run("--unit-cache-mb", "0", "--read_ahead_mb", "8", "--progress-seconds", "3", tmp_path=tmp_path)
    assert (cfg.unit_cache_mb, cfg.read_ahead_mb, cfg.progress_seconds) == (0.0, 8.0, 3.0)  # the flag over the variable
    config = tmp_path / "run.yaml"
    config.write_text("unit_cache_mb: 100\nread_ahead_mb: 0\nprogress_seconds: 60\n")
    cfg = _run("--config", str(config), tmp_path=tmp_path)
    assert (cfg.unit_cache_mb, cfg.read_ahead_mb, cfg.progress_seconds) == (100.0, 0.0, 60.0)
    with pytest.raises(ConfigError, match=r"^--unit-cache-mb must be a number of MB >= 0 \(0: off\), got -1.0$"):
        _run("--unit-cache-mb", "-1", tmp_path=tmp_path)
    with pytest.raises(ConfigError, match=r"^--progress-seconds must be a number of seconds > 0, got 0.0$"):
        _run("--progress-seconds", "0", tmp_path=tmp_path)
    monkeypatch.setenv("RESCORE_READ_AHEAD_MB", "lots")
    with pytest.raises(ConfigError, match=r"^RESCORE_READ_AHEAD_MB must be a number of MB >= 0 \(0: off\), got 'lots'$"):
        _run(tmp_path=tmp_path)


def test_a_bad_new_option_is_one_line_and_exit_2(tmp_path):
    from batched import run_many

    (tmp_path / "in.parquet").touch()
    out = tmp_path / "out"
    [(code, err), (code2, err2)] = run_many(str(tmp_path / "err"), [
        ["--input", str(tmp_path / "in.parquet"), "--output", str(out), "--strategy", "grpo", "--read-ahead-mb", "-2"],
        (["--input", str(tmp_path / "in.parquet"), "--output", str(out), "--strategy", "grpo"],
         {"RESCORE_PROGRESS_SECONDS": "soon"}),
    ])
    assert (code, err) == (2, "rescore: error: --read-ahead-mb must be a number of MB >= 0 (0: off), got -2.0\n")
    assert (code2, err2) == (2, "rescore: error: RESCORE_PROGRESS_SECONDS must be a number of seconds > 0, got 'soon'\n")
    assert not out.exists()


def test_the_readme_flag_table_has_every_option():
    """A declared option is documented: each flag (its dashed form) heads a row of README.md's
    flag table."""
    import re

    rows = [line.split("|")[1] for line in open(os.path.join(ROOT, "README.md"), encoding="utf-8") if line.startswith("| `--")]
    heads = " ".join(rows)
    flags = [flags_of(f)[0] for f in [*table(), *MODEL_FLAGS] if flags_of(f)]
    assert [flag for flag in flags if not re.search(rf"{re.escape(flag)}\b", heads)] == []
