"""Usage and help: a bare `rescore` lists every command, each usage line parses, --help mentions
the subcommands and documents --log-level."""

from __future__ import annotations

import pytest

from batched import forked_run as _forked


@pytest.fixture(scope="module")
def bare(forked):
    """A bare `rescore`: the usage lines (one process for the tests that read them)."""
    return _forked(forked)


def test_bare_rescore_prints_usage_with_every_command(bare):
    p = bare
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("usage: rescore")
    for command in ("rescore sample --output DIR", "rescore report OUTPUT_DIR", "rescore --input"):
        assert command in p.stderr


def test_help_mentions_sample_and_report(forked):
    p = _forked(forked, "--help")
    assert p.returncode == 0
    assert "rescore sample --output DIR" in p.stdout and "rescore report OUTPUT_DIR" in p.stdout
    assert "--keep-filtered" in p.stdout and "--audit-columns" in p.stdout


def test_every_usage_line_parses(bare, tmp_path, monkeypatch):
    """Each command the bare `rescore` lists exists, with options its parser accepts."""
    import argparse
    import re

    from rescore.pipelines import config, export, report, sample, show, task_stats

    text = bare.stderr
    lines = [line.strip() for line in text[text.index("commands:"):].splitlines() if line.strip().startswith("rescore ")]
    lines = [line for line in lines if "--help" not in line]
    commands = {line.split()[1] if not line.split()[1].startswith("-") else "" for line in lines}
    assert commands == {"", "sample", "report", "show", "task-stats", "export"}, lines

    class Parsed(BaseException):  # past a command's own catch-all of a failed run
        pass

    real = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        raise Parsed(real(self, args, namespace))  # parsed: stop before the command runs

    values = {"N": "2", "X": "0.5", "NAME": "grpo", "KEY=VALUE": "grpo.epsilon=0.1", "PATH_OR_GLOB": "in/*.parquet",
              "sft|dpo": "sft"}
    for line in lines:
        usage_part = re.split(r"\s{2,}", line)[0]
        tokens = [t.strip("[]") for t in usage_part.split()[1:] if t != "..." and t.strip("[]") != "..."]
        argv = [values.get(t, str(tmp_path / t.lower()) if t.isupper() else t) for t in tokens]
        if argv[0].startswith("-"):
            cfg = config.parse_args(argv)  # raises ConfigError on an unknown option
            assert cfg.strategies == ["grpo"], line
            continue
        main = {"sample": sample.main, "report": report.main, "show": show.main, "task-stats": task_stats.main,
                "export": export.main}[argv[0]]
        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
        known = argparse.ArgumentParser.parse_known_args

        def parse_known_only(self, args=None, namespace=None, known=known):  # task-stats passes the rest to Beam
            raise Parsed(known(self, args, namespace))

        monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_only)
        try:
            with pytest.raises(Parsed):
                main(argv[1:])
        finally:
            monkeypatch.undo()


def test_log_level_has_help():
    from rescore.pipelines.config import _parser

    text = _parser().format_help()
    assert "--log-level" in text and "streams the log" in " ".join(text.split())
