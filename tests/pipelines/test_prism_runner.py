"""`--runner PrismRunner` on Beam's Go portable runner, built once with `go install` at the SDK's
version into ~/.cache/rescore/prism/ (no download at run time): the same bytes as in-process.
Without the binary the run refuses in one line (exit 2) instead of downloading it."""

import os
import shutil
import subprocess

import apache_beam
import pytest
from data import SCHEMA_MULTI_STEP, multi_step_rows, write_parquet

from rescore.errors import ConfigError
from rescore.pipelines.config import parse_args, prism_binary

CHAIN = ["--strategy", "reward_variance,grpo,duplicate_informative", "--set", "std_cal_level=batch"]


@pytest.fixture(scope="session")
def prism(tmp_path_factory):
    """The Prism binary for this Beam, built with `go install` once (cached), or a skip saying why."""
    try:
        return prism_binary()
    except ConfigError:
        pass
    if os.environ.get("RESCORE_CLUSTER_TESTS") != "1":
        pytest.skip("no Prism binary built, and building one is opt-in (RESCORE_CLUSTER_TESTS=1): `go install`"
                    " takes up to 16 minutes on a 2-core machine (docs/runners.md has the command)")
    if shutil.which("go") is None:
        pytest.skip("`go` is not on PATH (Prism is built from Beam's Go module with `go install`)")
    target = os.path.dirname(
        os.environ.get("RESCORE_PRISM")
        or os.path.join(os.path.expanduser("~"), ".cache", "rescore", "prism", f"bin-{apache_beam.__version__}", "prism")
    )
    build = subprocess.run(
        ["go", "install", f"github.com/apache/beam/sdks/v2/go/cmd/prism@v{apache_beam.__version__}"],
        env={**os.environ, "GOBIN": target}, capture_output=True, text=True, timeout=1500,
    )
    if build.returncode != 0:
        pytest.skip(f"`go install` of Prism failed: {build.stderr.strip().splitlines()[-1:]}")
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
