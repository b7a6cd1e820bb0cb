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


def test_what_a_stage_needs_from_a_row_is_an_object():
    """Issue 41: a need is a column name, an OptionalColumn / NullableColumn or a Feature the
    stage's own module defines (strategies/features.py); no "@..." mini-language is parsed,
    and the row layer's read (rows/keys.py, rows/unit_rows.py) imports no stage module."""
    import pickle
    import re

    from rescore.needs import NullableColumn, OptionalColumn
    from rescore.transforms.strategies import chain_of, create, features
    from rescore.transforms.strategies.reinforce_pp import DiscountSums
    from rescore.transforms.strategies.repetition import NgramRepeat

    found = []
    for folder in ("transforms", "pipelines", "schemas", "rescore"):
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in (f for f in files if f.endswith(".py")):
                path = os.path.join(base, name)
                text = open(path, encoding="utf-8").read()
                found += [f"{os.path.relpath(path, ROOT)}: {x}" for x in re.findall(r"[\"']@[a-z_]+:?", text)]
    assert found == []
    allowed = {"features", "flat", "hashing"}
    for name in ("keys.py", "unit_rows.py"):
        text = open(os.path.join(ROOT, "transforms", "rows", name), encoding="utf-8").read()
        used = set(re.findall(r"rescore\.transforms\.strategies\.(\w+)", text))
        assert used <= allowed, (name, used - allowed)
        assert "\n    from " not in text and "\n        from " not in text, name  # no import inside a function

    assert create("reinforceplusplus", {"gamma": 0.9}).needs == (DiscountSums(0.9, "trinity"),)
    assert chain_of("ngram_repetition_filter", {"rep_len": 3}).needs == ("tokens", NgramRepeat(3)) and NgramRepeat(3).column == "ngram_repeat_3"
    chains = [
        ("gigpo", {}), ("normalize_then_sum", {"reward_keys": ["a", "b"]}), ("kl_penalty,reinforce_plus_plus", {"reinforce_plus_plus": {"gamma": 0.9}}),
        ("rollout_correction,optimal_token_baseline", {"rollout_correction": {"rollout_is": "sequence"}}), ("rollout_correction,clipb", {"rollout_correction": {"rollout_is": "token"}}),
    ]
    kinds = set()
    for strategy, params in chains:
        needs = chain_of(strategy, params).needs
        assert needs == chain_of(strategy, params).needs and hash(needs) == hash(chain_of(strategy, params).needs)
        assert pickle.loads(pickle.dumps(needs)) == needs  # Beam pickles the read with them
        for need in needs:
            assert isinstance(need, (str, OptionalColumn, NullableColumn, features.Feature)), need
        kinds |= {type(n).__name__ for n in needs if not isinstance(n, str)}
    assert kinds == {"OptionalColumn", "WholeBatch", "NullableColumn", "KLSums", "CorrectionMasks", "PathVariance", "ClipBSums"}
    # Two stages that differ in a parameter need different features (a chain lists each once).
    a = chain_of("rollout_correction,clipb", {"rollout_correction": {"rollout_is": "token"}}).needs
    b = chain_of("rollout_correction,clipb", {"rollout_correction": {"rollout_is": "sequence"}}).needs
    assert a[2] != b[2] and a[-1] != b[-1] and a[0] == b[0]
    assert _imported("import json, sys\nimport rescore.transforms.strategies.features\n"
                     "print(json.dumps(sorted(m for m in ('torch', 'numpy') if m in sys.modules)))") == []
