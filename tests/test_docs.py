"""The docs cannot rot: every command in README.md and every docs/*.md page runs as written.

Each page is read in order: its indented code lines (continuation backslashes joined, `&&`
chains split) and its Python blocks (an indented block starting with `import` or `from`). The
pages are discovered (every docs/*.md, whoever wrote it), and they all run in ONE scratch
directory, in order (README.md, then docs/*.md by name), as a newcomer reads them in one
checkout: it starts as the README's quickstart leaves the repository root (`data/sample/`
written by `rescore sample --output data/sample`, `out/sample/` by the quickstart's run, no
run_configs/: `--config run_configs/NAME.yaml` finds the shipped configs), and each page sees
what the pages before it wrote, so a page whose command collides with an earlier page's output
fails (test_no_command_collides_with_an_earlier_output finds it without running anything). The
steps of a page run one after another, exactly as written, as a reader pasting them would:
  - `rescore ...` and `.venv/bin/rescore ...` (after `source .venv/bin/activate` they are the
    same command) run in-process and must exit 0;
  - `python -c` / `.venv/bin/python -c` lines and the Python blocks run in a subprocess;
  - what needs a cloud or a cluster (Dataflow, Flink, a worker pool on a fixed port, a crontab
    for another machine) is parsed into Rescore's options and Beam's pipeline options, so a
    misspelt flag fails here; the Dataflow `--dry_run=True` command runs (with the [gcp] extra);
  - tool commands (pip, docker, gcloud, source) are listed in NOT_RUN with the reason;
  - a synopsis (`rescore --input 'PATH_OR_GLOB' --output DIR ...`) is not a command.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", *sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))]
NOT_RUN = {
    "python3.11 -m venv": "the quickstart itself: creates the environment the tests run in (.ci/run runs it)",
    "pip install": "installs packages; the test environment is installed by it",
    "source .venv/bin/activate": "puts .venv/bin first on PATH; the tests run `rescore` and `python` from that environment",
    "PATH=": "starts a worker pool on a fixed port; tests/pipelines/test_runners.py starts one on a free port",
    "docker": "no Docker here; tests/pipelines/test_device.py checks the Dockerfile",
    "gcloud": "needs Google Cloud; the Flex Template parameters are checked in tests/pipelines/test_runners.py",
    ".venv/bin/python -m pytest": "this is the test run",
    "0 3 * * *": "a crontab line for another machine; its rescore command is checked (parsed) below",
    "GOBIN=": "builds Prism with go (minutes); tests/pipelines/test_prism_runner.py builds and runs it",
    "python tools/flink_local.py": "starts a local Flink cluster (Java and Maven, minutes); tests/pipelines/test_flink_cluster.py runs it",
    "python -m rescore.pipelines.sample_models": "writes tiny models; the scratch directory's models/ is written by the same function",
}
REMOTE = ("DataflowRunner", "FlinkRunner", "dataflow.yaml", "dataflow_gpu.yaml", "flink.yaml", "gs://", "s3://",
          "job_endpoint=localhost", "environment_type=EXTERNAL")
COMMAND_STARTS = ("rescore ", ".venv/bin/", "python", "pip ", "gcloud ", "docker ", "PATH=", "GOBIN=", "0 3 * * *", "cd ", "source ")


def _parts(line: str) -> list[str]:
    return [p.strip() for p in re.split(r"\s&&\s", line.strip()) if p.strip()]


def _steps(doc: str) -> list[tuple[str, str]]:
    """The page's steps in order: ("shell", one command) or ("python", a block)."""
    steps: list[tuple[str, str]] = []
    block: list[str] | None = None
    current = ""
    for raw in open(os.path.join(ROOT, doc), encoding="utf-8").read().splitlines() + [""]:
        indented = raw.startswith("    ") and bool(raw.strip())
        if block is not None:
            if indented:
                block.append(raw[4:])
                continue
            steps.append(("python", "\n".join(block)))
            block = None
        if not indented:
            current = ""
            continue
        text = raw[4:].rstrip()
        if not current and text.startswith(("import ", "from ")):
            block = [text]
            continue
        current = f"{current} {text.strip()}" if current else text
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        if current.startswith("0 3 * * *"):  # a crontab line: one step (its command runs on another machine)
            steps.append(("shell", current))
        else:
            steps += [("shell", part) for part in _parts(current)]
        current = ""
    return steps


def _rescore_argv(part: str) -> list[str] | None:
    """The arguments of a `rescore` command line (None for anything else)."""
    for prefix in (".venv/bin/rescore ", "rescore "):
        if part.startswith(prefix) and not part.startswith("rescore:"):
            return shlex.split(part[len(prefix):], comments=True)
    return None


def _synopsis(argv: list[str]) -> bool:
    return any(t in ("DIR", "OUTPUT_DIR", "PATH_OR_GLOB", "NAME", "FILE.yaml") or t.startswith("[") for t in argv) or "..." in argv


def _explained(part: str) -> bool:
    return any(part.startswith(k) or k in part for k in NOT_RUN)


@pytest.fixture(scope="session")
def quickstart(tmp_path_factory):
    """The repository root as the quickstart leaves it: data/sample/ and out/sample/."""
    from rescore.pipelines.cli import main
    from rescore.pipelines.sample import main as sample_main

    d = tmp_path_factory.mktemp("docs-quickstart")
    os.chdir(d)
    try:
        assert sample_main(["--output", "data/sample"]) == 0
        assert main(["--input", "data/sample/*.parquet", "--output", "out/sample", "--strategy", "grpo",
                     "--overwrite", "--quiet"]) == 0
    finally:
        os.chdir(ROOT)
    return d


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory):
    """docs/models.md's models/ (tiny random-weight models), where transformers is installed."""
    try:
        from rescore.pipelines.sample_models import write_tiny_models

        d = str(tmp_path_factory.mktemp("docs-models"))
        write_tiny_models(d)
        return d
    except ImportError:
        return None


def test_every_page_is_covered():
    assert "README.md" in DOCS and os.path.join("docs", "training.md") in DOCS
    assert all(os.path.exists(os.path.join(ROOT, d)) for d in DOCS)
    commands = [p for d in DOCS for k, p in _steps(d) if k == "shell" and _rescore_argv(p)]
    assert len(commands) >= 40
    assert any(_rescore_argv(c)[0] == "report" for c in commands) and any("--algorithm" in c for c in commands)


@pytest.fixture(scope="session")
def newcomer(quickstart, models_dir, tmp_path_factory):
    """ONE working directory for every page, as a newcomer has: the quickstart's, where the pages
    run in DOCS order (README.md, then docs/*.md) and each sees what the pages before it wrote,
    so a command that collides with an earlier page's output fails here as it would for them."""
    scratch = tmp_path_factory.mktemp("docs-newcomer") / "repo"
    shutil.copytree(quickstart, scratch)
    if models_dir:
        os.symlink(models_dir, scratch / "models")
    return scratch


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCS)
def test_doc_runs_as_written_in_order(doc, newcomer, models_dir, tmp_path, monkeypatch, capsys):
    from apache_beam.options.pipeline_options import PipelineOptions

    from rescore.pipelines.config import parse_args
    from rescore.pipelines.cli import main

    scratch = newcomer
    monkeypatch.chdir(scratch)
    env = {**os.environ, "PYTHONPATH": ROOT, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf")}
    ran = 0
    for kind, text in _steps(doc):
        where = f"{doc}: {text}"
        if kind == "python":
            proc = subprocess.run([sys.executable, "-c", text], cwd=scratch, env=env, capture_output=True, text=True,
                                  timeout=300)
            assert proc.returncode == 0, f"{where}\n{proc.stderr}"
            ran += 1
            continue
        if text.startswith("0 3 * * *"):  # a crontab line: check the command it runs
            argv = _rescore_argv(text.split("&&", 1)[1].strip()) if "&&" in text else None
            assert argv, where
            PipelineOptions(parse_args(argv).beam_args).get_all_options()
            continue
        python_c = next((text[len(p):] for p in (".venv/bin/python -c ", "python -c ") if text.startswith(p)), None)
        if python_c is not None:
            proc = subprocess.run([sys.executable, "-c", *shlex.split(python_c)[:1]], cwd=scratch, env=env,
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, f"{where}\n{proc.stderr}"
            ran += 1
            continue
        argv = _rescore_argv(text)
        if argv is None or _synopsis(argv):
            continue  # not a command (or explained in NOT_RUN: test_every_shell_command_is_run_checked_or_explained)
        if any(f" {m}/" in f" {text}" for m in ("models",)) and not models_dir:
            pytest.skip("the model flags need the [models] extra (transformers)")
        if "--dry_run=True" in argv:
            pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient", reason="needs the [gcp] extra")
            assert main(argv) == 0, f"{where}\n{capsys.readouterr().err}"
            assert "job graph" in capsys.readouterr().err, where
            ran += 1
            continue
        if "PrismRunner" in argv:  # runs where the Prism binary is built, else parses with a stand-in
            from rescore.errors import ConfigError
            from rescore.pipelines.config import prism_binary

            try:
                prism_binary()
            except ConfigError:
                PipelineOptions(parse_args([*argv, "--prism_location=/nonexistent/prism"]).beam_args).get_all_options()
                continue
            # its own process: Prism's job service and Beam's runner state stay out of this one
            proc = subprocess.run([sys.executable, "-m", "rescore", *argv], cwd=scratch, env=env,
                                  capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, f"{where}\n{proc.stderr}"
            ran += 1
            continue
        if any(r in text for r in REMOTE):
            PipelineOptions(parse_args(argv).beam_args).get_all_options()  # Beam knows every option
            continue
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 0, f"{where}\n{err}"
        ran += 1
    if doc in ("README.md", "docs/strategies.md", "docs/training.md"):
        assert ran >= 3, f"{doc}: only {ran} steps ran"


COMMANDS_NOT_RUN_OR_CHECKED = ("rescore ", ".venv/bin/rescore ", ".venv/bin/python -c ", "python -c ", "python -m rescore ")


def test_every_shell_command_is_run_checked_or_explained():
    """A command in the docs is either run or checked above, or listed in NOT_RUN with why."""
    unexplained = []
    for doc in DOCS:
        for kind, part in _steps(doc):
            if kind != "shell" or not part.startswith(COMMAND_STARTS) or part.startswith("rescore:"):
                continue
            if part.startswith(COMMANDS_NOT_RUN_OR_CHECKED) and not _explained(part):
                continue  # run or checked by test_doc_runs_as_written_in_order
            if not _explained(part):
                unexplained.append(f"{doc}: {part}")
    assert not unexplained, "\n".join(unexplained)


def test_no_page_uses_inputs_that_the_quickstart_does_not_make():
    """After the quickstart only data/sample/ exists: `exp/*.parquet` or `data/*.parquet` would
    match nothing (the docs' own example files, e.g. data/buffer.db, are made by the page)."""
    stale = []
    for doc in DOCS:
        for kind, part in _steps(doc):
            argv = _rescore_argv(part) if kind == "shell" else None
            if argv and "--input" in argv and not any(r in part for r in REMOTE):
                value = argv[argv.index("--input") + 1]
                if value in ("exp/*.parquet", "data/*.parquet") or value.startswith("exp/"):
                    stale.append(f"{doc}: {part}")
    assert not stale, "\n".join(stale)


def _python_commands(block: str) -> list[list[str]]:
    """The command lines a Python block runs through `main([...])` (string literals only)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(block)):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "main"
                and node.args and isinstance(node.args[0], ast.List)
                and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.args[0].elts)):
            found.append([e.value for e in node.args[0].elts])
    return found


def _writes(argv: list[str]) -> tuple[str, str] | None:
    """(output directory, which command's output) a command line writes, or None."""
    def value(flag):
        return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None

    command = argv[0] if argv and not argv[0].startswith("-") else ""
    out = value("--output")
    if command in ("", "task-stats", "export") and out:
        kind = {"": "scored run", "task-stats": "task-stats output", "export": "export"}[command]
        return os.path.normpath(out), kind + (" (incremental)" if "--incremental" in argv else "")
    return None


def test_no_command_collides_with_an_earlier_output():
    """Read in order (README.md, then docs/*.md), no command writes into a directory another
    command wrote earlier (a scored run over a task-stats output is refused), nor a finished
    output of its own kind again without --overwrite (refused too): each command has its own
    --output. The same rule as the in-order run above, checked in a second."""
    seen: dict[str, tuple[str, str]] = {}
    clashes = []
    for doc in DOCS:
        for kind, text in _steps(doc):
            lines = _python_commands(text) if kind == "python" else [_rescore_argv(text)]
            for argv in lines:
                if not argv or _synopsis(argv) or (kind == "shell" and any(r in text for r in REMOTE)):
                    continue
                written = _writes(argv)
                if written is None:
                    continue
                out, what = written
                if out in seen:
                    (where, before) = seen[out]
                    if before != what:
                        clashes.append(f"{doc}: {' '.join(argv)}: {out} holds a {before} ({where})")
                    elif "--overwrite" not in argv and "(incremental)" not in what:
                        clashes.append(f"{doc}: {' '.join(argv)}: {out} holds a finished {before} ({where}); no --overwrite")
                seen[out] = (doc, what)
    assert not clashes, "\n".join(clashes)
