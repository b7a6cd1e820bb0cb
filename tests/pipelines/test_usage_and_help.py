"""Usage and help: a bare `rescore` lists every command, each usage line parses, --help mentions
the subcommands and documents --log-level."""

from __future__ import annotations

import pytest

from batched import forked_run as _forked


@pytest.fixture(scope="module")
def bare(forked):
    """A bare `rescore`: the usage lines (one process for the tests that read them)."""
    return _forked(forked)


def _usage_lines(text: str) -> list[str]:
    """The command column of the `commands:` list in `text` (each line's usage, before its summary
    or its `# summary` comment), or of every `rescore` line of a text without that heading."""
    import re

    return [re.split(r"\s{2,}|\s#", line.strip())[0] for line in text[text.find("commands:") + 1:].splitlines()
            if line.strip().startswith("rescore ")]


def test_bare_rescore_prints_usage_with_every_command(bare):
    """A bare `rescore` lists the commands (exit 2 and stderr, as any command line that runs
    nothing: a script that calls it by mistake fails), not argparse's option usage."""
    p = bare
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("usage: rescore COMMAND ...\n\ncommands:\n")
    for command in ("rescore sample --output DIR", "rescore report OUTPUT_DIR", "rescore --input", "rescore strategies [NAME]",
                    "rescore configs", "rescore task-stats", "rescore export", "rescore show"):
        assert command in p.stderr
    assert "--skip-bad-files" not in p.stderr and len(p.stderr.splitlines()) < 30  # commands, not every option


def test_readme_usage_is_what_bare_rescore_prints(bare):
    """README.md's "Usage" block lists the same commands, in the same order, as a bare `rescore`."""
    import os

    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md"), encoding="utf-8").read()
    block = readme[readme.index("## Usage"):]
    block = block[:block.index("\n\n", block.index("    rescore"))]
    assert _usage_lines(block) == _usage_lines(bare.stderr)


def test_help_is_grouped_common_options_first(forked):
    """--help: the options a first run needs, then the rest under headings; every option once."""
    from rescore.pipelines import options

    p = _forked(forked, "--help")
    assert p.returncode == 0
    text = p.stdout
    headings = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert headings[:2] == ["commands", "common options"], headings
    assert headings[2:2 + len(options.HELP_GROUPS)] == [title for title, _ in options.HELP_GROUPS]
    assert headings[-1].startswith("model stage")
    common = text[text.index("common options:"):text.index(options.HELP_GROUPS[0][0] + ":")]
    for flag in ("--input PATH_OR_GLOB", "--output DIR", "--strategy NAME", "--algorithm NAME", "--set KEY=VALUE", "--config",
                 "--overwrite", "--quiet"):
        assert f"\n  {flag}" in common, flag
    # each option once, in its dashed form; all of them are there
    from rescore.pipelines.model_flags import MODEL_FLAGS
    from rescore.transforms.settings import flags_of

    listed = [line.split()[0].rstrip(",") for line in text[text.index("common options:"):].splitlines()
              if line.startswith("  -")]
    declared = [flags_of(f)[0] for f in [*options.table(), *MODEL_FLAGS] if flags_of(f)]
    assert sorted(listed) == sorted(["-h", *declared])
    # 77 strategy names are `rescore strategies`' to list, not --help's
    assert "zero_variance_filter" not in text and "`rescore strategies` lists all" in " ".join(text.split())


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

    from rescore.pipelines import listings

    lines = _usage_lines(bare.stderr)
    commands = {line.split()[1] if not line.split()[1].startswith("-") else "" for line in lines}
    assert commands == {"", "sample", "report", "show", "task-stats", "export", "strategies", "configs"}, lines

    class Parsed(BaseException):  # past a command's own catch-all of a failed run
        pass

    real = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        raise Parsed(real(self, args, namespace))  # parsed: stop before the command runs

    values = {"N": "2", "X": "0.5", "NAME": "grpo", "KEY=VALUE": "grpo.epsilon=0.1", "PATH_OR_GLOB": "in/*.parquet",
              "sft|dpo": "sft"}
    for line in lines:
        tokens = [t.strip("[]") for t in line.split()[1:] if t != "..." and t.strip("[]") != "..."]
        argv = [values.get(t, str(tmp_path / t.lower()) if t.isupper() else t) for t in tokens]
        if argv[0].startswith("-"):
            cfg = config.parse_args(argv)  # raises ConfigError on an unknown option
            assert cfg.strategies == ["grpo"], line
            continue
        if argv[0] in ("strategies", "configs"):  # listings: no parser, they print
            assert getattr(listings, argv[0])(argv[1:]) == 0, line
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
