"""`--runner PrismRunner` on Beam's Go portable runner, built once with `go install` at the SDK's
version into ~/.cache/rescore/prism/ (no download at run time): the same bytes as in-process.
Without the binary the run refuses in one line (exit 2) instead of downloading it."""

import fcntl
import os
import shutil
import subprocess

import apache_beam
import pytest
from data import SCHEMA_MULTI_STEP, multi_step_rows, write_parquet

from rescore.errors import ConfigError
from rescore.pipelines.config import parse_args, prism_binary

CHAIN = ["--strategy", "reward_variance,grpo,duplicate_informative", "--set", "std_cal_level=batch"]


def _build_prism(target):
    """`go install` Prism at this Beam's version into `target` (a temporary GOBIN, then one
    rename, so a half-copied binary is never found); returns why it failed, or None."""
    staging = target + ".tmp"
    build = subprocess.run(
        ["go", "install", f"github.com/apache/beam/sdks/v2/go/cmd/prism@v{apache_beam.__version__}"],
        env={**os.environ, "GOBIN": staging}, capture_output=True, text=True, timeout=1500,
    )
    if build.returncode != 0:
        return f"`go install` of Prism failed: {(build.stderr.strip().splitlines() or ['(no output)'])[-1]}"
    os.makedirs(target, exist_ok=True)
    os.replace(os.path.join(staging, "prism"), os.path.join(target, "prism"))
    shutil.rmtree(staging, ignore_errors=True)
    return None


@pytest.fixture(scope="session")
def prism():
    """The Prism binary for this Beam, built with `go install` once (cached), or a skip saying why.

    The build holds an flock on the cache (as .ci/run's background build does with flock(1)),
    so a test process waits for a build in progress instead of starting a second one."""
    if os.environ.get("RESCORE_CLUSTER_TESTS") == "0":
        pytest.skip("RESCORE_CLUSTER_TESTS=0: the Prism and Flink cluster tests are turned off")
    target = os.path.dirname(
        os.environ.get("RESCORE_PRISM")
        or os.path.join(os.path.expanduser("~"), ".cache", "rescore", "prism", f"bin-{apache_beam.__version__}", "prism")
    )
    lock_dir = os.path.dirname(target)
    os.makedirs(lock_dir, exist_ok=True)
    with open(os.path.join(lock_dir, ".build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # waits for a build in progress (.ci/run starts one)
        try:
            return prism_binary()
        except ConfigError:
            pass
        if shutil.which("go") is None:
            pytest.skip("`go` is not on PATH (Prism is built from Beam's Go module with `go install`)")
        why = _build_prism(target)
    if why:
        pytest.skip(why)
    return prism_binary()


def test_prism_runner_without_the_binary_refuses_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("RESCORE_PRISM", str(tmp_path / "missing" / "prism"))
    with pytest.raises(ConfigError, match=r"--runner PrismRunner needs Beam's Prism binary at .*go install"):
        parse_args(["--input", "in", "--output", "out", "--strategy", "grpo", "--runner", "PrismRunner"])
    cfg = parse_args(["--input", "in", "--output", "out", "--strategy", "grpo", "--runner", "PrismRunner",
                      "--prism_location=/opt/prism"])
    assert "--prism_location=/opt/prism" in cfg.beam_args  # a given location is Beam's to use
    cfg = parse_args(["--input", "in", "--output", "out", "--strategy", "grpo", "--runner", "DirectRunner"])
    assert cfg.beam_args[-2:] == ["--runner=FnApiRunner", "--default_sdk_harness_log_level=WARN"]


@pytest.mark.slow
def test_prism_output_is_byte_identical_to_in_process(prism, tmp_path):
    from rescore.pipelines.cli import run

    experience = write_parquet(multi_step_rows(5), str(tmp_path / "in"), files=3, row_group_size=8,
                               schema=SCHEMA_MULTI_STEP)
    outs = {}
    for name, extra in (("local", []), ("prism", ["--runner", "PrismRunner"])):
        out = str(tmp_path / name)
        doc = run(["--input", experience, "--output", out, *CHAIN, *extra])
        assert os.path.exists(os.path.join(out, "_SUCCESS")) and doc["totals"]["rows_duplicated"] > 0
        outs[name] = {n: open(os.path.join(out, n), "rb").read() for n in sorted(os.listdir(out))
                      if n.endswith(".parquet")}
    assert outs["prism"] and outs["prism"] == outs["local"]
