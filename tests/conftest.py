import os
import sys

import pyarrow.parquet as pq
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


def needs_gcp():
    """Skip the calling test, with the reason, where the [gcp] extra (Beam's Dataflow client) is
    not installed: Rescore refuses --runner DataflowRunner without it (test_missing_extras.py)."""
    pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient", reason="needs the [gcp] extra")


@pytest.fixture
def rescore(tmp_path):
    """Run the job in-process; returns (metrics document, output dir)."""
    from rescore.pipelines.cli import run

    def _run(input_glob, *args, output=None):
        out = output or str(tmp_path / "out")
        doc = run(["--input", input_glob, "--output", out, RUNNER, "--quiet", *args])
        return doc, out

    return _run


@pytest.fixture(scope="module")
def forked(tmp_path_factory):
    """`rescore` processes forked from one child that imported Rescore once (batched.py), each
    with its own exit status, stdout and stderr (`batched.forked_run`); `batched.rescore_process`
    where the process's start-up matters."""
    from batched import ForkedRuns

    with ForkedRuns(tmp_path_factory.mktemp("forked")) as runs:
        yield runs


@pytest.fixture(scope="module")
def sample_input(tmp_path_factory):
    """64 rows of `rescore sample`'s experience in one file of 4 row groups: 4 read units."""
    from rescore.pipelines.sample import make_experience

    d = tmp_path_factory.mktemp("sample-input")
    pq.write_table(make_experience(batches=2, tasks=8, runs=4, seed=1), str(d / "part-0.parquet"), row_group_size=16)
    return str(d / "*.parquet")


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """What `rescore sample` writes by default (512 rows): the quickstart's input."""
    from rescore.pipelines.sample import main as sample_main

    d = tmp_path_factory.mktemp("sample")
    assert sample_main(["--output", str(d / "data")]) == 0
    return str(d / "data" / "*.parquet")
