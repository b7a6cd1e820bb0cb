"""The Beam side of a run's command line: every argument that is not a Rescore flag must be a
Beam pipeline option (a typo fails instead of being dropped silently), the runner it names and
what that runner needs (a local path Dataflow's workers cannot reach, the [gcp] extra, a Prism
binary), and the local runner Rescore pins when none is named."""

from __future__ import annotations

import difflib
import importlib
import logging
import os

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

from rescore.errors import ConfigError, first_line
from rescore.pipelines.flink_options import FLINK_OPTIONS, as_beam_passes_them, split_flink_options
from rescore.pipelines.options import parser as _parser

log = logging.getLogger("rescore.pipelines.config")

DEFAULT_RUNNER = "FnApiRunner"


_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")


def _beam_option(args: list[str], name: str) -> str | None:
    value = None
    for i, a in enumerate(args):
        if a == f"--{name}" and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(f"--{name}="):
            value = a.split("=", 1)[1]
    return value


def _is_local_address(address: str) -> bool:
    """host[:port] (or scheme://host:port) names this machine."""
    import socket

    host = address.split("://", 1)[-1].split("/", 1)[0]
    host = host[1:].split("]", 1)[0] if host.startswith("[") else (host.rsplit(":", 1)[0] if host.count(":") == 1 else host)
    return host.lower() in _LOCAL_HOSTS or host.startswith("127.") or host == socket.gethostname()


def _remote_workers(args: list[str]) -> str | None:
    """Where the runner's workers may be other machines ("FlinkRunner's workers (--flink_master=...)"), else None:
    Flink with a JobManager elsewhere, Spark with a cluster master, Dask with a scheduler
    elsewhere, a portable job service elsewhere (Dataflow is checked on its own)."""
    runner = (_runner_name(args) or "").rsplit(".", 1)[-1].lower().removesuffix("runner")
    option = {"flink": "flink_master", "spark": "spark_master_url", "dask": "dask_client_address",
              "portable": "job_endpoint"}.get(runner)
    if option is None:
        return None
    address = _beam_option(args, option)
    if not address or address in ("[auto]", "[local]", "embed") or address.startswith("local"):
        return None  # Beam's defaults run the workers on this machine (Spark: local[N])
    if _is_local_address(address):
        return None
    return f"{_runner_name(args)}'s workers (--{option}={address})"


def _check_paths_reach_workers(args: list[str], inputs: list[str], output: str, input_table,
                               shared_filesystem: bool = False) -> None:
    """A runner whose workers are other machines reads and publishes every path there: a local
    input or output would be read or published on disks the launcher never sees (or fail
    half-way). Dataflow's workers never mount the launcher's disk: refused. Flink, Spark, Dask
    and portable clusters elsewhere may share a mount, which Rescore cannot tell: refused unless
    `--shared-filesystem` says so (docs/runners.md, "What a cluster changes")."""
    if any(a in ("--dry_run=True", "--dry_run=true") for a in args):
        return  # the job graph is built, nothing runs
    paths = [("--output", output)] + ([] if input_table else [("--input", i) for i in inputs])
    local = [(flag, path) for flag, path in paths if "://" not in path]
    if not local:
        return
    flag, path = local[0]
    if (_runner_name(args) or "").lower() in ("dataflowrunner", "dataflow"):
        raise ConfigError(
            f"{flag} {path!r} is a local path, which DataflowRunner's workers cannot reach: use gs://BUCKET/..."
        )
    where = _remote_workers(args)
    if where and not shared_filesystem:
        raise ConfigError(
            f"{flag} {path!r} is a local path, which {where} may not reach: use gs://, s3:// or hdfs://, "
            "or pass --shared-filesystem if every worker mounts it at the same path"
        )


_WORKERS_ELSEWHERE = ("flink", "spark", "portable")
"""Runners whose SDK workers are processes the runner starts, in their own working directory."""


def _absolute_for_workers(args: list[str], inputs: list[str], output: str) -> tuple[list[str], str]:
    """Local --input/--output paths made absolute where a cluster's workers read and write them:
    a TaskManager's SDK worker runs in its own working directory, where `data/*.parquet` means
    nothing (or another file). Paths with a scheme, and every path of other runners, unchanged."""
    runner = (_runner_name(args) or "").rsplit(".", 1)[-1].lower().removesuffix("runner")
    if runner not in _WORKERS_ELSEWHERE:
        return inputs, output

    def absolute(path: str) -> str:
        return path if "://" in path else os.path.abspath(os.path.expanduser(path))

    return [absolute(i) for i in inputs], absolute(output)


def _runner_name(args: list[str]) -> str | None:
    return _beam_option(args, "runner")


def _import_runner_options(args: list[str]) -> str | None:
    """Import the module of the named runner, so the options it defines (DaskRunner's
    `--dask_client_address`, a custom runner's) are Beam options like the ones Rescore imports
    itself. Returns why the module could not be imported, or None."""
    runner = _runner_name(args)
    if not runner:
        return None
    from apache_beam.runners import runner as beam_runner

    known = {**beam_runner._RUNNER_MAP, "daskrunner": "apache_beam.runners.dask.dask_runner.DaskRunner"}
    path = known.get(runner.lower(), known.get(runner.lower() + "runner", runner))
    if "." not in path:
        return None
    try:
        importlib.import_module(path.rsplit(".", 1)[0])
    except Exception as e:  # a missing extra (dask, ...): the option stays unknown, and we say why
        return f"{type(e).__name__}: {first_line(e, blank='')}"
    return None


def _check_beam_args(args: list[str]) -> None:
    why_not = _import_runner_options(args)
    try:  # Flink's own options (Java only): accepted by name with --runner FlinkRunner, values checked
        _, args = split_flink_options(args, _runner_name(args))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)  # the same parser Beam builds in get_all_options
    try:
        _, unknown = parser.parse_known_args(args)
    except SystemExit:
        raise ConfigError(f"invalid Beam pipeline options: {' '.join(args)}") from None
    if unknown:
        first = unknown[0]
        if not first.startswith("-"):
            raise ConfigError(f"unexpected argument {first!r}")
        flag = first.split("=", 1)[0]
        known = [o for a in parser._actions for o in a.option_strings] + [
            o for a in _parser()._actions for o in a.option_strings
        ] + [f"--{name}" for name in FLINK_OPTIONS]
        hint = difflib.get_close_matches(flag, known, n=1)
        did_you_mean = f" (did you mean {hint[0]}?)" if hint else ""
        runner_note = f" (runner {_runner_name(args)}'s module did not import: {why_not})" if why_not else ""
        raise ConfigError(
            f"unknown option {flag}{did_you_mean}: not a Rescore flag nor a Beam pipeline option{runner_note}"
        )


def _with_flink_options(args: list[str]) -> list[str]:
    """The run's Beam args with Flink's own options (checked by _check_beam_args) written the way
    Beam's FlinkRunner forwards them to the Java runner (pipelines/flink_options.py)."""
    flink, rest = split_flink_options(args, _runner_name(args))
    return rest + as_beam_passes_them(flink)


def _with_default_runner(args: list[str]) -> list[str]:
    """Pin a local runner that never downloads anything.

    Beam 2.77's DirectRunner first fetches the Prism binary; Rescore runs its in-process
    FnApiRunner instead, the runner DirectRunner itself falls back to for batch jobs.
    """
    runner = _runner_name(args)
    if runner is None:
        return [*args, f"--runner={DEFAULT_RUNNER}"]
    if runner in ("DirectRunner", "SwitchingDirectRunner"):
        log.info("running %s as the in-process FnApiRunner (no Prism download)", runner)
        return [*args, f"--runner={DEFAULT_RUNNER}"]
    if runner in ("PrismRunner", "Prism") and not any(a.startswith("--prism_location") for a in args):
        return [*args, f"--prism_location={prism_binary()}"]
    return args


def prism_binary() -> str:
    """The Prism binary `--runner PrismRunner` uses when no --prism_location is given:
    $RESCORE_PRISM, or the one `go install` built into ~/.cache/rescore/prism/ for this Beam.

    Beam would download a release zip from GitHub at run time (and can hang where that host is
    unreachable); Rescore refuses instead, saying how to build the binary."""
    import apache_beam

    path = os.environ.get("RESCORE_PRISM") or os.path.join(
        os.path.expanduser("~"), ".cache", "rescore", "prism", f"bin-{apache_beam.__version__}", "prism")
    if not os.access(path, os.X_OK):
        raise ConfigError(
            f"--runner PrismRunner needs Beam's Prism binary at {path}: build it with "
            f"`GOBIN={os.path.dirname(path)} go install github.com/apache/beam/sdks/v2/go/cmd/prism@v{apache_beam.__version__}`"
            " or pass --prism_location=PATH"
        )
    return path


def _with_worker_log_level(args: list[str], level: str) -> list[str]:
    """SDK workers (multi-process, portable) log at INFO by default; follow --log-level.

    Written as Java's level name (`WARN`, which Python's logging also knows): a Java job server
    (Flink's, Spark's) parses the pipeline options into its own enum and rejects `WARNING`."""
    if any(a.startswith("--default_sdk_harness_log_level") for a in args):
        return args
    return [*args, f"--default_sdk_harness_log_level={'WARN' if level == 'WARNING' else level}"]


def _check_runner_extra(beam_args: list[str]) -> None:
    """The Dataflow runner needs the [gcp] extra where the job is launched (a dry run too):
    without it, one line naming the extra, before any work (Beam's own ImportError would come
    from inside the pipeline's run)."""
    if _runner_name(beam_args) not in ("DataflowRunner", "dataflow", "Dataflow"):
        return
    try:  # by module name: an attribute left on the package by an earlier import does not count
        importlib.import_module("apache_beam.runners.dataflow.internal.apiclient")
    except ImportError:
        raise ConfigError(
            "--runner DataflowRunner needs the [gcp] extra where the job is launched (a --dry_run=True too): "
            "pip install 'rescore[gcp]' (from the repository: .venv/bin/pip install '.[gcp]')"
        ) from None


def pipeline_args(args: list[str], *, inputs: list[str], output: str, input_table=None,
                  shared_filesystem: bool = False, log_level: str = "WARNING") -> list[str]:
    """The one entry point for the runner arguments of every command that runs Beam (the run
    command and `rescore task-stats`): `args` are the arguments that are not the command's own
    flags, in any spelling (`--runner X`, `--runner=X`, a YAML's pipeline_options turned into
    flags). Every check, before any work (ConfigError, exit 2, one line): each is a Beam
    pipeline option (a typo is refused with a did-you-mean), the runner's module imports, local
    paths with a cluster elsewhere are refused unless `shared_filesystem`, the runner's extra is
    installed. Returns the arguments Beam is given: with the local runner Rescore pins where none
    is named, Flink's own options as Beam's FlinkRunner forwards them, and the SDK workers' log
    level."""
    _check_beam_args(args)
    _check_paths_reach_workers(args, inputs, output, input_table, shared_filesystem)
    final = _with_worker_log_level(_with_default_runner(_with_flink_options(args)), log_level)
    _check_runner_extra(final)
    return final
