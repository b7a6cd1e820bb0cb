import os
import sys

import pytest

# The shared helpers (data, reference, refs, trinity_real) live here and the tests in directories
# that mirror the package (README.md); a test module another one imports (test_estimators_refs,
# test_trinity_roundtrip) is found by its basename from any of them, so basenames are unique.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
for _part in ("strategies", "rows", "transforms", "files", "pipelines", "schemas"):
    sys.path.append(os.path.join(_HERE, _part))

# Never let a test reach for Prism or any download: pin the in-process Python runner.
RUNNER = "--runner=FnApiRunner"


@pytest.fixture
def rescore(tmp_path):
    """Run the job in-process; returns (metrics document, output dir)."""
    from rescore.pipelines.cli import run

    def _run(input_glob, *args, output=None):
        out = output or str(tmp_path / "out")
        doc = run(["--input", input_glob, "--output", out, RUNNER, "--quiet", *args])
        return doc, out

    return _run
