"""The fault-injection seam: armed only by its own variable, read per run, never per bucket."""

import os

import pytest

from rescore.errors import InjectedFault
from rescore.transforms import fault_injection


@pytest.fixture(autouse=True)
def _disarmed(monkeypatch):
    monkeypatch.delenv(fault_injection.ENV, raising=False)
    monkeypatch.setattr(fault_injection, "_armed", None)  # and back to what it was after the test


class _OsWithoutEnvironment:
    """The `os` module as fault_injection sees it, with no environment to read."""

    def __getattr__(self, name):
        if name in ("environ", "getenv"):
            raise AssertionError("a hook read the environment")
        return getattr(os, name)


def _every_hook():
    fault_injection.maybe_fail_once("ScoreGroups")
    fault_injection.maybe_slow_write()
    fault_injection.maybe_pause_readback()
    fault_injection.maybe_pause_finalize()
    fault_injection.maybe_kill_at("locked")
    fault_injection.maybe_fail_insert("x.parquet")


def test_unarmed_hooks_do_nothing_and_never_read_the_environment(monkeypatch):
    monkeypatch.setattr(fault_injection, "os", _OsWithoutEnvironment())
    _every_hook()


def test_the_old_generic_variable_arms_nothing(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv("RESCORE_FAULT", f"fail_once:{marker}")
    fault_injection.refresh()
    _every_hook()
    assert not marker.exists()


def test_the_variable_is_read_at_refresh_not_in_the_hooks(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv(fault_injection.ENV, f"fail_once:{marker}")
    fault_injection.maybe_fail_once("ScoreGroups")  # armed only by the next run's refresh()
    assert not marker.exists()
    fault_injection.refresh()
    monkeypatch.setattr(fault_injection, "os", _OsWithoutEnvironment())
    with pytest.raises(InjectedFault, match=f"injected fault in ScoreGroups \\({fault_injection.ENV}=fail_once:"):
        fault_injection.maybe_fail_once("ScoreGroups")
    assert marker.exists()
    fault_injection.maybe_fail_once("ScoreGroups")  # once: the marker now exists
    fault_injection.maybe_fail_insert("x.parquet")  # another kind stays off


def test_each_kind_fires_only_on_its_own_hook(tmp_path, monkeypatch):
    monkeypatch.setenv(fault_injection.ENV, "fail_insert:1")
    fault_injection.refresh()
    fault_injection.maybe_fail_once("ScoreGroups")
    with pytest.raises(InjectedFault, match="after inserting x.parquet"):
        fault_injection.maybe_fail_insert("x.parquet")

    pause = tmp_path / "pause"
    pause.mkdir()
    (pause / "resume").touch()
    monkeypatch.setenv(fault_injection.ENV, f"pause_finalize:{pause}")
    fault_injection.refresh()
    fault_injection.maybe_pause_readback()
    assert not (pause / "paused").exists()
    fault_injection.maybe_pause_finalize()
    assert (pause / "paused").exists()


def test_a_run_rereads_the_variable(tmp_path, monkeypatch):
    """pipelines/job.py run_job() refreshes, so one process can run a faulty job then a clean one."""
    from rescore.errors import InputError
    from rescore.pipelines import cli

    argv = ["--input", str(tmp_path / "none-*.parquet"), "--output", str(tmp_path / "out"), "--strategy", "grpo"]
    monkeypatch.setenv(fault_injection.ENV, "slow_write:5")
    with pytest.raises(InputError):
        cli.run(argv)
    assert fault_injection._armed == ("slow_write", "5")
    monkeypatch.delenv(fault_injection.ENV)
    with pytest.raises(InputError):
        cli.run(argv)
    assert fault_injection._armed is None
