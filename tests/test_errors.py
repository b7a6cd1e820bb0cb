"""Every error Rescore raises on purpose is defined in rescore/errors.py; the old names resolve."""

import ast
import importlib
import os
import subprocess
import sys

import pytest

from rescore import errors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_DIRS = ("rescore", "pipelines", "transforms", "schemas")

# Where each class lived before errors.py; code and users still reach it there.
OLD_NAMES = [
    ("rescore.transforms.strategies", "ConfigError", errors.ConfigError),
    ("rescore.transforms.strategies.registry", "ConfigError", errors.ConfigError),
    ("rescore.schemas", "SchemaError", errors.SchemaError),
    ("rescore.schemas.experience", "SchemaError", errors.SchemaError),
    ("rescore.transforms.read", "InputError", errors.InputError),
    ("rescore.transforms.files.ownership", "OutputError", errors.OutputError),
    ("rescore.transforms.files.lock", "LockBusy", errors.LockBusy),
    ("rescore.transforms.files.fingerprint", "InputChanged", errors.InputChanged),
    ("rescore.transforms.rows.groups", "GroupTooLarge", errors.GroupTooLarge),
    ("rescore.transforms.inference", "ModelConfigError", errors.ModelConfigError),
    ("rescore.transforms.rows.trinity_format", "BlobError", errors.BlobError),
    ("rescore.transforms.device", "DeviceError", errors.DeviceError),
    ("rescore.pipelines.job", "RejectBudgetExceeded", errors.RejectBudgetExceeded),
    ("rescore.pipelines.incremental", "ConflictError", errors.ConflictError),
    ("rescore.pipelines.report", "ReportError", errors.ReportError),
    ("rescore.pipelines.load", "OutputError", errors.NotFinishedOutputError),
    ("rescore.transforms.fault_injection", "InjectedFault", errors.InjectedFault),
]


@pytest.mark.parametrize("module, name, cls", OLD_NAMES, ids=[f"{m}.{n}" for m, n, _ in OLD_NAMES])
def test_old_names_are_the_classes_in_errors(module, name, cls):
    assert getattr(importlib.import_module(module), name) is cls


def test_no_module_but_errors_defines_an_exception():
    defined = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, BaseException)}
    exceptions = defined | {"Exception", "BaseException", "ValueError", "RuntimeError", "OSError", "KeyError"}
    found = []
    for top in PACKAGE_DIRS:
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in (f for f in files if f.endswith(".py")):
                path = os.path.join(folder, f)
                if path == errors.__file__:
                    continue
                for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                    bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in getattr(node, "bases", [])}
                    if isinstance(node, ast.ClassDef) and (bases & exceptions or node.name.endswith("Error")):
                        found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name}")
    assert not found, f"define these in rescore/errors.py: {found}"


def test_hierarchy_and_exit_status_groups():
    assert issubclass(errors.OutputError, errors.ConfigError)
    assert issubclass(errors.ModelConfigError, errors.ConfigError)
    assert not issubclass(errors.NotFinishedOutputError, errors.OutputError)  # a different error, same old name
    assert set(errors.USER_ERRORS) == {errors.ConfigError, errors.SchemaError, errors.InputError, errors.OutputError, errors.LockBusy}
    assert set(errors.RUN_FAILURES) == {errors.RejectBudgetExceeded, errors.ConflictError}
    assert not set(errors.USER_ERRORS) & set(errors.RUN_FAILURES)
    from rescore.pipelines import cli

    assert cli.USER_ERRORS is errors.USER_ERRORS


@pytest.mark.parametrize("module", ["rescore.errors", "rescore.user_code", "rescore.transforms.files.layout",
                                    "rescore.transforms.fault_injection"])
def test_errors_names_and_hooks_import_nothing_heavy(module):
    """Whatever imports them (rescore.load_scored, `rescore show`) stays free of Beam and torch."""
    code = (f"import sys, {module}; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'apache_beam', 'pyarrow', 'torch', 'numpy'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_first_line_is_the_first_non_blank_line_or_the_class_name():
    assert errors.first_line(ValueError("\n  bad thing  \nat line 3")) == "bad thing"
    assert errors.first_line(OSError("x" * 500), limit=300) == "x" * 300
    assert errors.first_line(KeyError()) == "KeyError"
    assert errors.first_line(RuntimeError(" \n"), blank="") == ""
    assert errors.first_line("plain text\nmore") == "plain text"
    assert errors.last_line(RuntimeError("wrapped by the runner\n  the step's own error \n\n")) == "the step's own error"
    assert errors.last_line(ValueError()) == "ValueError"


def test_one_loader_for_module_function_specs(tmp_path, monkeypatch):
    """--reward-fn and --group-filter load 'module:function' with one loader: the same one-line
    errors (a module whose import raises a many-line error is quoted by its first line; the
    verifier quoted the whole message before)."""
    from rescore.transforms.strategies.user_filter import load_group_filter
    from rescore.transforms.verifier import load_reward_fn
    from rescore.user_code import load_function

    (tmp_path / "noisy_user_mod.py").write_text("raise RuntimeError('first\\nsecond\\nthird')\n")
    (tmp_path / "fine_user_mod.py").write_text("def f(reward):\n    return reward\nx = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_function("fine_user_mod:f", "--flag")(reward=2) == 2
    for load, flag, cls in ((load_reward_fn, "--reward-fn", errors.ModelConfigError),
                            (load_group_filter, "--group-filter", errors.ConfigError)):
        for spec, message in (("noisy_user_mod:f", f"{flag} noisy_user_mod:f: cannot import noisy_user_mod (RuntimeError: first)"),
                              ("fine_user_mod:x", f"{flag} fine_user_mod:x: fine_user_mod has no function 'x'"),
                              ("fine_user_mod", f"{flag} expects module:function, got 'fine_user_mod'")):
            with pytest.raises(cls) as e:
                load(spec)
            assert str(e.value) == message


@pytest.mark.parametrize("module, words", [("export", "export failed"), ("task_stats", "pipeline failed")])
def test_subcommands_quote_the_last_line_of_an_unexpected_error(module, words, monkeypatch, capsys):
    import importlib

    command = importlib.import_module(f"rescore.pipelines.{module}")

    def run(argv):
        raise RuntimeError("Traceback of the runner\n  ...\nKeyError: 'the step's own'\n")

    monkeypatch.setattr(command, "run", run)
    assert command.main([]) == 1
    assert capsys.readouterr().err == f"rescore: error: {words}: KeyError: 'the step's own'\n"
