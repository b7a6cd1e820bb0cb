"""The docs cannot rot: every command in README.md and docs/*.md is run or checked here.

Commands are the indented code lines of the Markdown files (continuation backslashes joined,
`&&` chains split). What runs on this machine runs, in a scratch directory that holds sample
data where the docs expect it (data/, data/sample/, exp/) and the repository's run_configs/:
  - `rescore ...` commands with local input and a local runner, `rescore sample`, `rescore report`;
  - the Dataflow `--dry_run=True` command (with the [gcp] extra);
  - the Python snippets (blocks starting with `import`) and `python -c` lines.
What needs a cloud or a cluster (Dataflow, Flink, a worker pool on a fixed port) is parsed into
Rescore's options and Beam's pipeline options, so a misspelt flag fails here. Tool commands
(pip, docker, gcloud) are listed in NOT_RUN with the reason.
"""

import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", *sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))]
NOT_RUN = {
    "python3.11 -m venv": "creates the environment the tests run in (.ci/run runs it)",
    "pip install": "installs packages; the test environment is installed by it",
    "PATH=": "starts a worker pool on a fixed port; tests/pipelines/test_runners.py starts one on a free port",
    "docker": "no Docker here; tests/pipelines/test_device.py checks the Dockerfile",
    "gcloud": "needs Google Cloud; the Flex Template parameters are checked in tests/pipelines/test_runners.py",
    ".venv/bin/python -m pytest": "this is the test run",
    "0 3 * * *": "a crontab line; its rescore command is checked below",
    "GOBIN=": "builds Prism with go (minutes); tests/pipelines/test_prism_runner.py builds and runs it",
    "python run_configs/flink_local.py": "starts a local Flink cluster (Java and Maven, minutes); tests/pipelines/test_flink_cluster.py runs it",
    "python -m rescore.pipelines.sample_models": "writes tiny models; the scratch directory's models/ is written by the same function",
}
REMOTE = ("DataflowRunner", "FlinkRunner", "dataflow.yaml", "dataflow_gpu.yaml", "flink.yaml", "gs://", "s3://",
          "job_endpoint=localhost", "environment_type=EXTERNAL")


def _code_lines(path):
    lines, current = [], ""
    for raw in open(os.path.join(ROOT, path), encoding="utf-8").read().splitlines():
        if raw.startswith("    ") and raw.strip():
            text = raw[4:].rstrip()
            if current:
                current += " " + text.strip()
            else:
                current = text
            if current.endswith("\\"):
                current = current[:-1].rstrip()
                continue
            lines.append(current)
        current = "" if not (raw.startswith("    ") and raw.rstrip().endswith("\\")) else current
    return lines


def _commands():
    found = []
    for doc in DOCS:
        for line in _code_lines(doc):
            if "crontab" in line or line.startswith("0 3 * * *"):
                line = line.split("&&", 1)[1].strip() if "&&" in line else line
            for part in re.split(r"\s&&\s", line):
                part = part.strip()
                if part.startswith(".venv/bin/rescore "):
                    part = part[len(".venv/bin/"):]
                if part.startswith("rescore ") and not part.startswith("rescore:"):
                    found.append((doc, part))
    return found


COMMANDS = _commands()


def _synopsis(cmd):
    tokens = shlex.split(cmd, comments=True)
    return any(t in ("DIR", "OUTPUT_DIR", "'PATH_OR_GLOB'", "PATH_OR_GLOB", "NAME") for t in tokens) or (
        tokens[-1] == "..." and "--input" not in tokens
    )


def _localise(argv):
    """Fill the reader's blanks: `...` stands for input and output; absolute paths that only
    exist on the reader's machine become the scratch directory's sample data and output."""
    out = []
    for i, token in enumerate(argv):
        prev = argv[i - 1] if i else ""
        if token == "...":
            if prev == "--input":
                out.append("data/*.parquet")
            elif prev == "--output":
                out.append("out/doc")
            else:
                out += ["--input", "data/*.parquet", "--output", "out/doc"]
        elif prev == "--input" and token.startswith("/") and not os.path.exists(os.path.dirname(token)):
            out.append("data/*.parquet")
        elif prev == "--output" and token.startswith("/"):
            out.append(os.path.join("out", os.path.basename(token.rstrip("/"))))
        else:
            out.append(token)
    return out


@pytest.fixture(scope="module")
def sample_dir(tmp_path_factory):
    from rescore.pipelines.sample import main as sample_main

    d = tmp_path_factory.mktemp("docs-sample")
    assert sample_main(["--output", str(d / "sample"), "--batches", "3", "--tasks", "6"]) == 0
    for fmt, name in (("trinity-sql", "buffer.db"), ("verl-rollouts", "rollouts")):  # docs/trainers.md
        assert sample_main(["--format", fmt, "--output", str(d / name), "--batches", "2", "--tasks", "4"]) == 0
    return str(d / "sample")


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """docs/models.md's models/ (tiny random-weight models), where transformers is installed."""
    try:
        from rescore.pipelines.sample_models import write_tiny_models

        d = str(tmp_path_factory.mktemp("docs-models"))
        write_tiny_models(d)
        return d
    except ImportError:
        return None


@pytest.fixture
def scratch(tmp_path, sample_dir, models_dir, monkeypatch):
    """A working directory laid out as the docs assume."""
    if models_dir:
        os.symlink(models_dir, tmp_path / "models")
    os.makedirs(tmp_path / "data")
    for name in os.listdir(sample_dir):
        os.symlink(os.path.join(sample_dir, name), tmp_path / "data" / name)
    os.symlink(sample_dir, tmp_path / "data" / "sample")
    for name in ("buffer.db", "rollouts"):
        os.symlink(os.path.join(os.path.dirname(sample_dir), name), tmp_path / "data" / name)
    os.symlink(sample_dir, tmp_path / "exp")
    os.symlink(os.path.join(ROOT, "run_configs"), tmp_path / "run_configs")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_docs_have_commands():
    assert len(COMMANDS) >= 25
    assert any("report" in c for _, c in COMMANDS) and any("--algorithm" in c for _, c in COMMANDS)


@pytest.mark.parametrize("doc, command", COMMANDS, ids=[f"{d}:{i}" for i, (d, _) in enumerate(COMMANDS)])
def test_doc_command(doc, command, scratch, capsys):
    from apache_beam.options.pipeline_options import PipelineOptions

    from rescore.pipelines.config import parse_args
    from rescore.pipelines.rescore import main

    if _synopsis(command):
        pytest.skip("a synopsis, not a command")
    if " models/" in command and not os.path.exists("models"):
        pytest.skip("the model flags need the [models] extra (transformers)")
    argv = _localise(shlex.split(command, comments=True)[1:])
    if argv[0] == "show":  # an incremental table to show (docs/runners.md builds one first)
        assert main(["--input", "data/*.parquet", "--output", argv[1], "--strategy", "grpo", "--quiet",
                     "--incremental", "--runner=FnApiRunner"]) == 0
        assert main(argv) == 0, capsys.readouterr().err
        return
    if argv[0] in ("sample", "report"):
        if argv[0] == "report":
            assert main(["--input", "data/*.parquet", "--output", argv[1], "--strategy", "grpo", "--quiet",
                         "--runner=FnApiRunner"]) == 0
        assert main(argv) == 0, capsys.readouterr().err
        return
    if "--dry_run=True" in argv:
        pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient", reason="needs the [gcp] extra")
        assert main(argv) == 0, capsys.readouterr().err
        assert "job graph" in capsys.readouterr().err
        return
    if "PrismRunner" in argv:  # runs where the Prism binary is built, else parses with a stand-in
        from rescore.errors import ConfigError
        from rescore.pipelines.config import prism_binary

        try:
            prism_binary()
        except ConfigError:
            cfg = parse_args([*argv, "--prism_location=/nonexistent/prism"])
            PipelineOptions(cfg.beam_args).get_all_options()
            return
    if any(r in command for r in REMOTE):
        cfg = parse_args(argv)
        PipelineOptions(cfg.beam_args).get_all_options()  # Beam knows every option
        return
    code = main([*argv, "--quiet"])
    assert code == 0, capsys.readouterr().err
    out = argv[argv.index("--output") + 1]
    assert os.path.exists(os.path.join(out, "_SUCCESS")) or os.path.exists(os.path.join(out, "_delta_log"))


def _python_blocks(path):
    blocks, block = [], []
    for raw in open(os.path.join(ROOT, path), encoding="utf-8").read().splitlines() + [""]:
        if raw.startswith("    ") and (block or raw[4:].startswith(("import ", "from "))):
            block.append(raw[4:])
        elif block:
            blocks.append("\n".join(block))
            block = []
    return blocks


SNIPPETS = [(doc, b) for doc in DOCS for b in _python_blocks(doc)]


@pytest.fixture(scope="module")
def snippet_outputs(sample_dir, tmp_path_factory):
    """The outputs the snippets read, written once: `out` and the incremental table `scored`."""
    from rescore.pipelines.rescore import main

    d = tmp_path_factory.mktemp("docs-outputs")
    data = os.path.join(sample_dir, "*.parquet")
    assert main(["--input", data, "--output", str(d / "out"), "--strategy", "grpo,duplicate_informative",
                 "--quiet", "--runner=FnApiRunner"]) == 0
    assert main(["--input", data, "--output", str(d / "scored"), "--strategy", "grpo", "--quiet",
                 "--incremental", "--runner=FnApiRunner"]) == 0
    return d


@pytest.mark.parametrize("doc, code", SNIPPETS, ids=[f"{d}:{i}" for i, (d, _) in enumerate(SNIPPETS)])
def test_doc_python_snippet(doc, code, scratch, snippet_outputs):
    import shutil

    shutil.copytree(snippet_outputs / "out", scratch / "out")  # a copy each: a snippet may write beside it
    if '"scored"' in code:  # reads the incremental table of docs/output.md
        shutil.copytree(snippet_outputs / "scored", scratch / "scored")
    env = {**os.environ, "PYTHONPATH": ROOT, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(scratch / "hf")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=scratch, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_readme_python_one_liners(scratch):
    from rescore.pipelines.rescore import main

    lines = [part for line in _code_lines("README.md") for part in re.split(r"\s&&\s", line)
             if part.strip().startswith(".venv/bin/python -c ")]
    assert lines
    assert main(["--input", "data/sample/*.parquet", "--output", "out/polaris", "--strategy",
                 "reward_variance,grpo,duplicate_informative", "--quiet", "--runner=FnApiRunner"]) == 0
    for line in lines:
        argv = shlex.split(line.strip())
        proc = subprocess.run([sys.executable, *argv[1:]], cwd=scratch, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr


COMMAND_STARTS = ("rescore ", ".venv/bin/", "python", "pip ", "gcloud ", "docker ", "PATH=", "GOBIN=", "0 3 * * *", "cd ")


def test_every_shell_command_is_run_checked_or_explained():
    """A command in the docs is either run or checked above, or listed in NOT_RUN with why."""
    unexplained = []
    for doc in DOCS:
        for line in _code_lines(doc):
            for part in re.split(r"\s&&\s", line.strip()):
                if not part.startswith(COMMAND_STARTS) or part.startswith("rescore:"):
                    continue
                if part.startswith(("rescore ", ".venv/bin/rescore ", ".venv/bin/python -c ", "python -m rescore")):
                    continue  # run or checked by the tests above (the module form is the same CLI)
                if not any(part.startswith(k) or k in part for k in NOT_RUN):
                    unexplained.append(f"{doc}: {part}")
    assert not unexplained, "\n".join(unexplained)
