import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# Never let a test reach for Prism or any download: pin the in-process Python runner.
RUNNER = "--runner=FnApiRunner"


@pytest.fixture
def rescore(tmp_path):
    """Run the job in-process; returns (metrics document, output dir)."""
    from rescore.pipelines.rescore import run

    def _run(input_glob, *args, output=None):
        out = output or str(tmp_path / "out")
        doc = run(["--input", input_glob, "--output", out, RUNNER, "--quiet", *args])
        return doc, out

    return _run
