"""The row layer (rescore.transforms.rows) is Arrow + numpy work: importing every module of it
must not import Apache Beam."""

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import importlib, json, pkgutil, sys
import rescore.transforms.rows as rows
names = sorted(m.name for m in pkgutil.iter_modules(rows.__path__))
for name in names:
    importlib.import_module("rescore.transforms.rows." + name)
print(json.dumps({"modules": names, "beam": sorted(m for m in sys.modules if m.split(".")[0] == "apache_beam")}))
"""


def test_no_module_of_the_row_layer_imports_beam():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    expected = sorted(m.name for m in pkgutil.iter_modules([str(ROOT / "transforms" / "rows")]))
    assert found["modules"] == expected and {"keys", "groups", "copies", "tokens", "outcomes"} <= set(expected)
    assert found["beam"] == [], f"the row layer imports Beam: {found['beam'][:5]}"


def test_sql_buffers_database_and_row_modules_import_neither_torch_nor_beam():
    """transforms/sql_database.py (SQLAlchemy) and rows/trinity_rows.py (buffer rows <-> Arrow)
    import neither Beam nor torch; only the Beam steps (sql_buffer.py) do, and a blob's tensors
    load torch where they are decoded. No row module imports the Beam side's device.py."""
    code = ("import json, sys\nimport rescore.transforms.sql_database, rescore.transforms.rows.trinity_rows\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'apache_beam'})))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    for path in (ROOT / "transforms" / "rows").glob("*.py"):
        assert "transforms.device" not in path.read_text(encoding="utf-8"), path.name
