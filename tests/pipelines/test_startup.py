"""Start-up: the launcher's path (option parsing, --help, a bad command line, planning) never
imports torch; only the scoring shells do, when a pipeline is built (issue 18)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _modules_after(code: str) -> dict:
    probe = code + "\nimport json, sys\nprint(json.dumps({m: m in sys.modules for m in ('torch', 'apache_beam')}))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_help_loads_beam_but_not_torch():
    loaded = _modules_after(
        "import contextlib, io\n"
        "from rescore.pipelines.rescore import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
    )
    assert loaded == {"torch": False, "apache_beam": True}


def test_planning_and_the_read_shell_do_not_load_torch():
    loaded = _modules_after("import rescore.transforms.read, rescore.transforms.rows.keys, rescore.transforms.device")
    assert loaded["torch"] is False


def test_building_the_scoring_shells_loads_torch():
    # the check above must be able to fail: the shells that score do load torch
    assert _modules_after("import rescore.transforms.score")["torch"] is True
