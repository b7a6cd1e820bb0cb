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


def test_light_row_features_are_declared_once():
    """REINFORCE++'s discount sums, the n-gram ratio and the off-policy columns are named in
    strategies/features.py alone; the strategies and the row layer (rows/keys.py) import them."""
    from rescore.transforms.strategies import features

    literals = ('"@discount:', '"@ngram_repeat:', '"@offpolicy:', '"discount_a"', '"discount_b"')
    found = []
    for folder in ("transforms", "pipelines", "schemas"):
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                path = os.path.join(base, name)
                if name.endswith(".py") and path != features.__file__:
                    text = open(path, encoding="utf-8").read()
                    found += [f"{os.path.relpath(path, ROOT)}: {x}" for x in literals if x in text]
    assert found == []
    assert _imported("import json, sys\nimport rescore.transforms.strategies.features\n"
                     "print(json.dumps(sorted(m for m in ('torch', 'numpy') if m in sys.modules)))") == []
    from rescore.transforms.strategies import create

    need = create("reinforceplusplus", {"gamma": 0.9}).needs
    assert need == (features.discount_need(0.9, "trinity"),) and features.discount_params(need[0]) == (0.9, "trinity")
