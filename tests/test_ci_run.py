"""`.ci/run` runs exactly the README's test command, and starts the cluster tests' fetch and
build (`.ci/cluster-deps`) in the background before it, taking the locks the fixtures take."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def test_ci_runs_the_readme_test_command_verbatim():
    readme = _read("README.md")
    (command,) = re.findall(r"^    (python3\.11 -m venv .*-m pytest.*)$", readme, re.M)
    ci = _read(".ci", "run")
    assert any(command in line for line in ci.splitlines()), command
    assert "-n 2 --dist loadfile --no-loadscope-reorder" in command  # one Flink cluster: a file stays in one process
    assert ci.index(".ci/cluster-deps") < ci.index(command)  # the background fetch starts first


def test_the_background_build_takes_the_fixtures_locks():
    deps = _read(".ci", "cluster-deps")
    assert "tools/flink_local.py fetch" in deps  # flink_local.fetch holds .fetch.lock itself
    assert 'flock "$cache/.build.lock"' in deps and '"$HOME/.cache/rescore/prism"' in deps
    assert '".build.lock"' in _read("tests", "pipelines", "test_prism_runner.py")
    assert '".fetch.lock"' in _read("tools", "flink_local.py")
