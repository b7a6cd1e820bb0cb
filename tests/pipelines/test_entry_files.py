"""The command run as a file, as schedulers do: Airflow's `py_file=.../pipelines/cli.py`
(examples/airflow_dag.py) and the Flex Template's FLEX_TEMPLATE_PYTHON_PY_FILE
(pipelines/flex_template.py). Python puts the file's folder first on sys.path, where
pipelines/rescore.py (the job module, now pipelines/job.py) shadowed the package `rescore`: every
import failed. Nothing in pipelines/ may bear the package's name (test below)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _file(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "pipelines", name), *args], cwd="/",
                          capture_output=True, text=True, timeout=300)


def test_the_cli_file_runs_the_command(tmp_path):
    proc = _file("cli.py", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--strategy", "grpoo")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("rescore: error: unknown strategy 'grpoo'") and proc.stderr.count("\n") == 1


def test_the_flex_template_file_starts():
    proc = _file("flex_template.py", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: rescore")
