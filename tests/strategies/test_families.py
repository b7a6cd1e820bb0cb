"""transforms/strategies/families.py: the table of which family declares which strategy is the
families' own (a run imports only the families of its strategies through it), `spec(name)`
imports one family, and a shipped name declared anywhere else is still refused."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = """
import json, sys
from rescore.transforms.strategies import families, registry

out = {}
registry.spec("grpo")  # one family
out["after_grpo"] = sorted(f for f in families.FAMILIES if f"{families.PACKAGE}.{f}" in sys.modules)

try:  # a shipped name, its family not imported yet: refused as it always was
    from rescore.transforms.strategies.registry import StrategyParams
    import dataclasses
    registry.register("reinforce", kind="advantage", summary="again")(dataclasses.dataclass(frozen=True)(type("P", (StrategyParams,), {})))
    out["again"] = "registered"
except ValueError as e:
    out["again"] = str(e)

declared = {}
real = registry.register
def register(name, **kwargs):  # which family module's body declares each strategy
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").rsplit(".", 1)[-1] not in families.FAMILIES:
        frame = frame.f_back
    declared[name] = frame.f_globals["__name__"].rsplit(".", 1)[-1] if frame else None
    return real(name, **kwargs)
for module in list(sys.modules.values()):  # (function_estimator.py holds its own reference)
    if getattr(module, "register", None) is real:
        module.register = register
for family in families.FAMILIES:
    for module in [m for m in sys.modules if m == f"{families.PACKAGE}.{family}"]:
        del sys.modules[module]
registry._REGISTRY.clear()
families.load_all()
out["declared"] = declared
out["names"] = registry.names()
print(json.dumps(out))
"""


def test_the_table_is_what_each_family_declares():
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", ROOT)}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    from rescore.transforms.strategies.families import FAMILY_OF

    missing = {n: f for n, f in got["declared"].items() if FAMILY_OF.get(n) != f}
    assert not missing, f"transforms/strategies/families.py: add each of these to its family's line: {missing}"
    assert sorted(FAMILY_OF) == sorted(got["declared"]) == got["names"]  # nothing listed that no family declares
    assert "offpolicy_spec" not in got["after_grpo"] and "grpo" in got["after_grpo"]
    assert got["again"] == "strategy 'reinforce' is already registered"
