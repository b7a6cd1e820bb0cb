"""Every import name lives under `rescore`: a user's own `schemas.py`, `transforms.py` or
`pipelines.py` in the working directory cannot shadow any part of Rescore."""

import glob
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from data import random_rows, write_parquet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHADOWS = ("schemas", "transforms", "pipelines", "examples")


@pytest.fixture
def user_dir(tmp_path):
    """A working directory like a web project's: modules with the generic names, which fail
    loudly if anything imports them."""
    for name in SHADOWS:
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the user\\'s own {name}.py was imported')\n")
    rows = random_rows(7)
    write_parquet(rows, str(tmp_path / "in"))
    (tmp_path / "rows").write_text(str(len(rows)))
    return tmp_path


def _run(cwd, *args):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["in_process", "multi_processing"])
def test_cli_runs_beside_shadowing_modules(user_dir, mode):
    beam = ["--runner=FnApiRunner"]
    if mode == "multi_processing":
        beam = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    proc = _run(user_dir, "-m", "rescore", "--input", "in/*.parquet", "--output", "out", "--strategy", "grpo", "--quiet", *beam)
    assert proc.returncode == 0, proc.stderr
    assert os.path.exists(user_dir / "out" / "_SUCCESS")
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in glob.glob(str(user_dir / "out" / "scored-*.parquet")))
    assert rows == int((user_dir / "rows").read_text())
    import rescore

    assert rescore.load_scored(str(user_dir / "out")).num_rows == rows  # the one way to read any output


def test_import_names(user_dir):
    code = (
        "import rescore, rescore.pipelines.job, rescore.transforms.strategies, rescore.schemas, "
        "rescore.examples.to_trinity, sys; "
        "print(rescore.__version__); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'pipelines', 'transforms', 'schemas', 'examples'}))"
    )
    proc = _run(user_dir, "-c", code)
    assert proc.returncode == 0, proc.stderr
    version, generic = proc.stdout.split("\n")[:2]
    assert version == "0.1.0"
    assert generic == "[]"  # nothing imported under a generic top-level name


@pytest.mark.slow
def test_help_from_console_script_and_module(user_dir):
    for argv in (["-m", "rescore", "--help"], ["-c", "import sys; sys.argv[0] = 'rescore'; from rescore.pipelines.cli import main; main()", "--help"]):
        proc = _run(user_dir, *argv)
        assert proc.returncode == 0, proc.stderr
        assert "--strategy" in proc.stdout


def test_installed_top_level_is_rescore_alone():
    """pyproject maps the repository's folders under `rescore`; no other top-level package."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        conf = tomllib.load(f)["tool"]["setuptools"]
    assert {p.split(".")[0] for p in conf["packages"]} == {"rescore"}
    for package, folder in conf["package-dir"].items():
        assert os.path.isfile(os.path.join(ROOT, folder, "__init__.py")), (package, folder)
    # The list is explicit: every package folder under a mapped one must be in it, or the wheel
    # installs without it.
    on_disk = {
        os.path.relpath(d, ROOT)
        for top in ("pipelines", "transforms", "schemas", "examples")
        for d, _, files in os.walk(os.path.join(ROOT, top))
        if "__init__.py" in files
    }
    assert {"transforms/strategies", "transforms/files"} <= on_disk
    assert {f"rescore.{d.replace(os.sep, '.')}" for d in on_disk} <= set(conf["packages"])


def test_load_scored_reads_below_the_launcher(tmp_path):
    """`rescore.load_scored` hands on the file layer's reader (transforms/files/scored.py), the
    one `rescore.pipelines.load` also names: it reads a finished output without importing Beam,
    torch or the launcher."""
    import pyarrow as pa

    import rescore
    from rescore.pipelines import load
    from rescore.transforms.files import scored

    assert load.load_scored is scored.load_scored and load.OutputError is scored.OutputError
    pq.write_table(pa.table({"batch": [0, 0, 1], "task": [3, 3, 4], "score": [0.5, -0.5, 0.0]}),
                   str(tmp_path / "scored-00000-of-00001.parquet"))
    (tmp_path / "_SUCCESS").write_text("")
    code = ("import json, sys, rescore\n"
            f"t = rescore.load_scored({str(tmp_path)!r})\n"
            "print(json.dumps([t.num_rows, t['score'].to_pylist(),"
            " sorted(m for m in sys.modules if m.split('.')[0] in {'apache_beam', 'torch'} or m.startswith('rescore.pipelines'))]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == '[3, [0.5, -0.5, 0.0], []]'
    (tmp_path / "_SUCCESS").unlink()
    with pytest.raises(rescore.errors.NotFinishedOutputError, match="not a finished Rescore output"):
        rescore.load_scored(str(tmp_path))
