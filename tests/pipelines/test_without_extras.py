"""The verdict does not depend on which extras are installed (issue 29).

Without the [gcp] extra, importing Beam logs that its GCS file system and apitools are missing,
the second through the root logger, which (no handler installed yet) calls logging.basicConfig:
a stderr handler that then wrote Beam's ERROR log of a failed step, a traceback, under the
command's one `rescore: error:` line, and the two import warnings before it. Here the [gcp]
modules Beam probes are made unimportable in a child process, which runs the command as a user
does (the console script) and as tests and Python callers do (`main(argv)`); its real stderr
must be the one line, as with the extra.
"""

import os
import subprocess
import sys
import textwrap

import pytest
from data import random_rows, write_parquet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GCP_MODULES = ("apitools", "google.cloud", "google.api_core", "google.auth", "googleapiclient", "google_auth_httplib2",
               "oauth2client")
"""What the [gcp] extra (apache-beam[gcp]) installs that Beam's import looks for."""

WITHOUT_GCP = textwrap.dedent(f"""
    import sys

    class _WithoutGcp:  # as if the [gcp] extra were not installed
        def find_spec(self, name, path=None, target=None):
            if any(name == m or name.startswith(m + ".") for m in {GCP_MODULES!r}):
                raise ModuleNotFoundError(f"No module named {{name!r}}")
            return None

    sys.meta_path.insert(0, _WithoutGcp())
""")


def _child(code: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_GCP + textwrap.dedent(code), *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory):
    """A run that fails inside the pipeline (a group over --max-group-rows): Beam logs the step's
    error with its traceback, and the command says it in one line, exit 1."""
    d = tmp_path_factory.mktemp("extras")
    write_parquet(random_rows(seed=5), str(d / "in"), files=1, row_group_size=8)
    return ["--input", str(d / "in"), "--output", str(d / "out"), "--strategy", "grpo", "--max-group-rows", "1"]


def test_without_gcp_beams_import_installs_a_stderr_handler():
    """The condition the tests below guard against is real: Beam's import, without the extra,
    leaves a handler on the root logger (where none was), which writes to stderr."""
    proc = _child("""
        import logging
        import apache_beam  # noqa: F401
        print([type(h).__name__ for h in logging.getLogger().handlers])
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['StreamHandler']"
    assert "apitools" in proc.stderr


def test_without_gcp_the_console_script_fails_with_one_line(failing_run):
    proc = _child("""
        sys.argv[0] = "rescore"
        from rescore.pipelines.cli import main
        main()
    """, *failing_run)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("rescore: error: ") and proc.stderr.count("\n") == 1, proc.stderr


def test_without_gcp_main_fails_with_one_line(failing_run):
    proc = _child("""
        import json
        from rescore.pipelines.cli import main
        sys.exit(main(sys.argv[1:]))
    """, *failing_run)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("rescore: error: ") and proc.stderr.count("\n") == 1, proc.stderr


def test_without_gcp_a_success_says_what_it_says_with_the_extra(failing_run, tmp_path):
    """A run that succeeds: its summary, and not Beam's import warnings."""
    argv = [a if a != failing_run[3] else str(tmp_path / "ok") for a in failing_run[:6]]
    proc = _child("""
        sys.argv[0] = "rescore"
        from rescore.pipelines.cli import main
        main()
    """, *argv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("rescore: grpo done -> "), proc.stderr
    assert "apitools" not in proc.stderr and "GCSFileSystem" not in proc.stderr
