"""Issue 14: the strategy math imports neither Arrow nor Beam, and the registry (names,
parameter declarations, checks, algorithm presets) loads without torch."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys

import pytest


import rescore.transforms.strategies as strategies
from rescore.transforms.strategies import algorithms

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = sorted(f"{strategies.__name__}.{m.name}" for m in pkgutil.iter_modules(strategies.__path__))


def _imported(code: str) -> dict:
    """Run `code` in a fresh interpreter and return the JSON it prints."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _forbidden_after_importing(modules) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"for m in {sorted(modules)!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(x for x in ('pyarrow', 'apache_beam') if x in sys.modules)))"
    )
    return _imported(code)


def test_the_module_list_is_the_package():
    assert f"{strategies.__name__}.grpo" in MODULES and f"{strategies.__name__}.registry" in MODULES
    assert f"{strategies.__name__}.variance" in MODULES and f"{strategies.__name__}.weights" in MODULES


def test_the_math_imports_neither_arrow_nor_beam():
    assert _forbidden_after_importing(MODULES) == []


def test_names_parameters_checks_and_presets_load_without_torch():
    code = """
import json, sys
from rescore.transforms.strategies import ConfigError, algorithms, names, spec
from rescore.transforms.strategies.registry import resolve
resolved = {n: resolve(n) for n in names()}
presets = {a: [resolve(s, algorithms.preset(a).params) for s in algorithms.preset(a).strategies] for a in algorithms.names()}
try:
    resolve("grpo", {"std_cal_level": "global"})
    error = None
except ConfigError as e:
    error = str(e)
print(json.dumps({"torch": "torch" in sys.modules, "names": len(resolved), "presets": len(presets), "error": error}))
"""
    out = _imported(code)
    assert out["torch"] is False
    assert out["names"] == len(strategies.names()) and out["presets"] == len(algorithms.names())
    assert out["error"] == "grpo: parameter 'std_cal_level' must be one of group, batch, got 'global'"


@pytest.mark.slow
def test_option_parsing_does_not_import_torch():
    out = _imported("import json, sys\nimport rescore.pipelines.config\nprint(json.dumps('torch' in sys.modules))")
    assert out is False


@pytest.mark.slow
def test_creating_a_strategy_loads_its_math():
    out = _imported(
        "import json, sys\nfrom rescore.transforms.strategies import create\n"
        "s = create('grpo')\nprint(json.dumps([type(s).__module__, 'torch' in sys.modules]))"
    )
    assert out == [f"{strategies.__name__}.grpo", True]
