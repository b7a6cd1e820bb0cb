"""Start-up: the launcher's path (option parsing, --help, a bad command line, planning) never
imports torch; only the scoring shells do, when a pipeline is built (issue 18)."""

import json
import os
import subprocess
import sys

import pytest

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
        "from rescore.pipelines.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
    )
    assert loaded == {"torch": False, "apache_beam": True}


@pytest.mark.slow
def test_planning_and_the_read_shell_do_not_load_torch():
    loaded = _modules_after("import rescore.transforms.read, rescore.transforms.rows.keys, rescore.transforms.device")
    assert loaded["torch"] is False


@pytest.mark.slow
def test_building_the_scoring_shells_loads_torch():
    # the check above must be able to fail: the shells that score with torch's math do load it
    assert _modules_after("import rescore.transforms.score\nfrom rescore.transforms.strategies import chain_of\nchain_of('grpo')")["torch"] is True


def test_a_grpo_run_on_numpy_never_imports_torch(tmp_path):
    """--strategy grpo on the CPU, by default (transforms/host_math.py): the whole run,
    a real process, imports no torch module (`-X importtime` lists every import it makes).
    tests/transforms/test_host_math.py compares its files with the torch path's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 48
    pq.write_table(pa.table({
        "batch": [0] * n, "task": [i // 6 for i in range(n)], "run": list(range(n)), "step": [0] * n,
        "reward": [float(i % 5) for i in range(n)], "tokens": [[1, 2, 3]] * n, "prompt_length": [1] * n,
    }), str(tmp_path / "in.parquet"))
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rescore", "--input", str(tmp_path / "in.parquet"),
         "--output", str(tmp_path / "out"), "--strategy", "grpo", "--device", "cpu", "--quiet"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**{k: v for k, v in os.environ.items() if k != "RESCORE_HOST_MATH"}, "PYTHONPATH": os.environ.get("PYTHONPATH", ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert os.path.exists(tmp_path / "out" / "_SUCCESS")
    names = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert {"numpy", "apache_beam", "rescore.transforms.strategies.grpo_np"} <= names  # the list is read right
    assert sorted(m for m in names if m == "torch" or m.startswith("torch.")) == []
    # nor Beam's optional integrations (pipelines/early.py: lean_imports). A name the finder refused
    # is still listed (a failed import); modules only a loaded package imports are not
    assert {"pandas.core.frame", "google.cloud.storage.blob", "boto3.session", "pymongo.mongo_client"} & names == set()


LEAN_PROBE = """
import json, sys
from rescore.pipelines.early import OPTIONAL_IMPORTS, lean_imports
with lean_imports(sys.argv[1:]) as lean:
    import apache_beam  # noqa: F401
import pyarrow as pa
pa.chunked_array([[1, 2]]).to_numpy()  # pyarrow looked for pandas once, in the block
loaded = {m for m in sys.modules for top in OPTIONAL_IMPORTS if m == top or m.startswith(top + ".")}
# (an empty namespace package a .pth file made at start-up, `google.cloud`, holds no code)
loaded = sorted(m for m in loaded if getattr(sys.modules[m], "__file__", None))
try:  # after the block, what is installed imports as usual (a user's filter function may use it)
    import pandas  # noqa: F401
    after = "pandas"
except ImportError as e:
    after = str(e)
print(json.dumps({"lean": lean, "loaded": loaded, "after": after}))
"""


def _lean(*argv: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", LEAN_PROBE, *argv], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", ROOT)}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_plain_local_run_loads_none_of_beams_optional_integrations(tmp_path):
    """pipelines/early.py: lean_imports. A plain run on local files imports Beam without its GCS,
    S3, BigQuery and MongoDB modules and without pandas; a run with a remote path or a Beam option
    imports whatever is installed (shown where pandas is: the check can fail)."""
    import importlib.util

    plain = _lean("--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out"), "--strategy", "grpo")
    assert plain["lean"] is True and plain["loaded"] == []
    if importlib.util.find_spec("pandas") is not None:
        assert plain["after"] == "pandas"  # not hidden once the imports are done
    for other in (["--input", "gs://b/in.parquet", "--output", str(tmp_path / "out")],
                  ["--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out"), "--runner", "FnApiRunner"]):
        got = _lean(*other)
        assert got["lean"] is False
        if importlib.util.find_spec("pandas") is not None:
            assert "pandas" in got["loaded"]


def test_only_plain_local_command_lines_are_lean():
    from rescore.pipelines.early import local_plain_run

    assert local_plain_run(["--input", "a/*.parquet", "--input", "b.parquet", "--output", "out", "--quiet"])
    for argv in (["--input", "s3://b/x.parquet", "--output", "out"], ["--input", "x.parquet", "--output", "gs://b/out"],
                 ["--input", "x.parquet", "--output", "out", "--config", "c.yaml"], ["sample", "--output", "x"], ["--help"], []):
        assert not local_plain_run(argv), argv


@pytest.mark.slow
def test_a_users_filter_function_imports_what_the_lean_imports_skipped(tmp_path):
    """A plain local command line may name a user's group filter (`--strategy group_filter,grpo
    --set function=MODULE:FUNCTION`): its module imports pandas (or anything Beam's import skipped)
    as it would anywhere, and the run goes through."""
    import importlib.util

    import pyarrow as pa
    import pyarrow.parquet as pq

    if importlib.util.find_spec("pandas") is None:
        pytest.skip("needs pandas installed (the test extra brings it)")
    (tmp_path / "uses_pandas.py").write_text(
        "import pandas as pd\n\ndef keep(group):\n    return bool(pd.Series(group['reward']).nunique() > 1)\n")
    n = 24
    pq.write_table(pa.table({
        "batch": [0] * n, "task": [i // 6 for i in range(n)], "run": list(range(n)), "step": [0] * n,
        "reward": [float(i % 2) if i < 12 else 1.0 for i in range(n)], "tokens": [[1, 2, 3]] * n, "prompt_length": [1] * n,
    }), str(tmp_path / "in.parquet"))
    proc = subprocess.run(
        [sys.executable, "-m", "rescore", "--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out"),
         "--strategy", "group_filter,grpo", "--set", "function=uses_pandas:keep", "--quiet"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", ROOT)])},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert (doc["totals"]["rows_written"], doc["totals"]["rows_filtered"]) == (12, 12)  # 2 of 4 groups all 1.0
